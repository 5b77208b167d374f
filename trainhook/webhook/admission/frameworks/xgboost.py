"""XGBoost (and LightGBM): Kubeflow XGBoostJob's variables, plus the DMLC tracker variables (contract section 4).

Kubeflow's reference is `SetPodEnv` in kubeflow/training-operator pkg/controller.v1/xgboost/xgboost.go
(v1.8/1.9): MASTER_PORT, MASTER_ADDR, WORLD_SIZE, RANK, PYTHONUNBUFFERED and, when the job has more than one
replica, WORKER_PORT and WORKER_ADDRS (read by LightGBM jobs). Its master is `<job>-master-0` and its workers
are ranked after the master. Here rank 0 is the master: `<job>-master-0.<job>` in a master+worker gang, the
workload's pod 0 in a single-role gang. WORKER_ADDRS lists every other member, which is exactly Kubeflow's list
when master=1 (Kubeflow needs a master; a single-role gang's pod 0 plays it).

The DMLC_* variables are the ones XGBoost's own tracker hands its workers (`RabitTracker.worker_args()` and
dmlc-core's tracker): rank 0 runs the tracker on MASTER_PORT, every pod passes these to
`xgboost.collective.CommunicatorContext`. Kubeflow's examples compute the same values from MASTER_ADDR,
MASTER_PORT, RANK and WORLD_SIZE in their own code.
"""

from __future__ import annotations

from trainhook.gang import keys
from trainhook.webhook.admission.frameworks import MAX_LISTED_MEMBERS, check_listed_length, check_listed_size
from trainhook.webhook.admission.member import Member, Problems, Shape, at_most_one

# Read by LightGBM-style code (Kubeflow's lightgbm-dist example): the other members and their port.
WORKER_PORT = "WORKER_PORT"
WORKER_ADDRS = "WORKER_ADDRS"
# Read by xgboost.collective (lower-cased as CommunicatorContext arguments): the tracker and this task's id.
DMLC_TRACKER_URI = "DMLC_TRACKER_URI"
DMLC_TRACKER_PORT = "DMLC_TRACKER_PORT"
DMLC_TASK_ID = "DMLC_TASK_ID"
DMLC_NUM_WORKER = "DMLC_NUM_WORKER"


def check_shape(shape: Shape, problems: Problems) -> None:
    at_most_one(shape, "master", "an XGBoost gang", problems, why="it runs the tracker")
    check_listed_size(shape, WORKER_ADDRS, "xgboost", problems)  # frameworks/__init__.py says why


def build_env(member: Member, gpus: int, problems: Problems) -> list[tuple[str, str]]:
    check_shape(member.shape, problems)
    master, port, world = member.rank0_address, str(member.port), str(member.shape.size)
    env = [
        (keys.MASTER_PORT, port),
        (keys.MASTER_ADDR, master),
        (keys.WORLD_SIZE, world),
        (keys.RANK, str(member.rank)),
        # Kubeflow writes "0"; CPython turns unbuffered output on for any non-empty value, so "0" and "1" act
        # the same, and "1" says what it does (the contract's value for PyTorch and Paddle).
        (keys.PYTHONUNBUFFERED, "1"),
    ]
    if 1 < member.shape.size <= MAX_LISTED_MEMBERS:
        workers = ",".join(member.all_addresses[1:])
        check_listed_length(WORKER_ADDRS, workers, problems)
        env += [(WORKER_PORT, port), (WORKER_ADDRS, workers)]
    env += [
        (DMLC_TRACKER_URI, master),
        (DMLC_TRACKER_PORT, port),
        (DMLC_TASK_ID, str(member.rank)),
        (DMLC_NUM_WORKER, world),
    ]
    return env
