"""PaddlePaddle: Kubeflow PaddleJob's variables (contract section 4).

Kubeflow's reference is `setPodEnv` in kubeflow/training-operator pkg/controller.v1/paddlepaddle/envvar.go
(v1.8/1.9): PYTHONUNBUFFERED, PADDLE_JOB_ID (the job's name), PADDLE_NNODES (all replicas) and PADDLE_MASTER,
the endpoint `paddle.distributed.launch` rendezvouses on (default port 36543). Without a master role the job
runs in collective mode and worker 0 hosts the rendezvous; with one it runs in parameter-server mode, master 0
hosts it, and every pod also gets PADDLE_SERVER_NUM=1 (master) or PADDLE_TRAINER_NUM=1 (worker).

The host itself is told differently. Paddle's launcher starts the rendezvous server only when PADDLE_MASTER's
host is literally `127.0.0.1` or the pod's own IP (paddle/distributed/launch/controllers/master.py,
HTTPMaster.lazy_init); given its own DNS name it would wait forever for a server nobody starts. Kubeflow
therefore gives that pod `$(POD_IP_DUMMY):<port>`, with POD_IP_DUMMY from the downward API (status.podIP). The
webhook's environment is plain values, so that pod gets `127.0.0.1:<port>`, the other spelling Paddle accepts
(its launcher then advertises the pod's IP itself); every other pod gets `<host>.<subdomain>:<port>`.
"""

from __future__ import annotations

from trainhook.gang import keys
from trainhook.webhook.admission.member import Member, Problems, Shape, at_most_one

# Read by paddle.distributed.launch as the defaults of --master, --nnodes and --job_id.
PADDLE_MASTER = "PADDLE_MASTER"
PADDLE_NNODES = "PADDLE_NNODES"
PADDLE_JOB_ID = "PADDLE_JOB_ID"
# Parameter-server mode only: each pod runs one server (master role) or one trainer (worker role).
PADDLE_SERVER_NUM = "PADDLE_SERVER_NUM"
PADDLE_TRAINER_NUM = "PADDLE_TRAINER_NUM"
# How the rendezvous host names itself (see above).
LOOPBACK = "127.0.0.1"


def check_shape(shape: Shape, problems: Problems) -> None:
    at_most_one(shape, "master", "a PaddlePaddle gang", problems, why="the rendezvous")


def build_env(member: Member, gpus: int, problems: Problems) -> list[tuple[str, str]]:
    check_shape(member.shape, problems)
    ps_mode = member.shape.count("master") > 0
    host_role = "master" if ps_mode else "worker"
    hosts_rendezvous = member.role == host_role and member.index == 0
    master = LOOPBACK if hosts_rendezvous else member.address(host_role, 0)
    env = [
        (keys.PYTHONUNBUFFERED, "1"),
        (PADDLE_JOB_ID, member.job_name),
        (PADDLE_NNODES, str(member.shape.size)),
        (PADDLE_MASTER, f"{master}:{member.port}"),
    ]
    if ps_mode:
        env.append((PADDLE_SERVER_NUM, "1") if member.role == "master" else (PADDLE_TRAINER_NUM, "1"))
    return env
