"""Distributed XGBoost: the tracker on rank 0, `xgboost.collective` in every pod, one model for all.

The code a Kubeflow XGBoostJob runs, unchanged: rank 0 (the master) starts XGBoost's tracker on MASTER_PORT,
and every pod joins it through `xgboost.collective` with its RANK. trainhook also injects the DMLC_* variables
the tracker hands its workers; under Kubeflow, which sets only MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE, the same
values are derived from those. Each pod trains on its own shard of synthetic data; the histograms are summed
across pods every round, so all of them end with the same model. The digest of that model is printed by every
pod and checked against rank 0's.
"""

import hashlib
import os

import numpy as np
import xgboost as xgb
from xgboost import collective
from xgboost.tracker import RabitTracker

ROUNDS = int(os.environ.get("ROUNDS", "20"))
ROWS = 2000


def shard(rank: int) -> tuple[np.ndarray, np.ndarray]:
    """This pod's rows of y = sin(x0) + x1 * x2 + noise (a different seed per rank)."""
    rng = np.random.default_rng(100 + rank)
    x = rng.normal(size=(ROWS, 6))
    return x, np.sin(x[:, 0]) + x[:, 1] * x[:, 2] + 0.1 * rng.normal(size=ROWS)


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    tracker = None
    if rank == 0:
        # sortby="task": the tracker gives each worker the rank it asks for (its DMLC_TASK_ID).
        tracker = RabitTracker(n_workers=world, host_ip="0.0.0.0", port=int(os.environ["MASTER_PORT"]),
                               sortby="task")
        tracker.start()
    args = {
        "dmlc_tracker_uri": os.environ.get("DMLC_TRACKER_URI", os.environ["MASTER_ADDR"]),
        "dmlc_tracker_port": int(os.environ.get("DMLC_TRACKER_PORT", os.environ["MASTER_PORT"])),
        "dmlc_task_id": os.environ.get("DMLC_TASK_ID", str(rank)),
        "dmlc_retry": 10,  # the tracker may start a little after its workers
    }
    with collective.CommunicatorContext(**args):
        if (collective.get_rank(), collective.get_world_size()) != (rank, world):
            raise SystemExit(f"tracker ranked this pod {collective.get_rank()}/{collective.get_world_size()}, "
                             f"expected {rank}/{world}")
        x, y = shard(rank)
        rows = int(collective.allreduce(np.array([len(y)], dtype=np.float64), collective.Op.SUM)[0])
        print(f"rank {rank}/{world} on {os.environ.get('HOSTNAME', '?')}: {len(y)} of {rows} rows", flush=True)
        dtrain = xgb.DMatrix(x, y)
        params = {"tree_method": "hist", "max_depth": 4, "eta": 0.3, "objective": "reg:squarederror"}
        booster = xgb.train(params, dtrain, ROUNDS, evals=[(dtrain, "train")], verbose_eval=5)
        digest = hashlib.sha256(booster.save_raw("json")).hexdigest()[:16]
        same = digest == collective.broadcast(digest, 0)
        print(f"final model digest {digest} identical-across-workers={same}", flush=True)
    if tracker is not None:
        tracker.wait_for()
    if not same:
        raise SystemExit("models differ across workers")


if __name__ == "__main__":
    main()
