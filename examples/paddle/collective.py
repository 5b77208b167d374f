"""PaddlePaddle collective training on CPU: `paddle.distributed.launch` in every pod, DataParallel over Gloo.

The code a Kubeflow PaddleJob runs, unchanged: each pod starts `python -m paddle.distributed.launch
collective.py`, and the launcher takes its rendezvous (--master), node count (--nnodes) and job id from the
PADDLE_MASTER, PADDLE_NNODES and PADDLE_JOB_ID variables. This script then joins the process group the launcher
set up, trains a small regression model on its own shard of synthetic data, and checks at the end that every
rank holds identical parameters (DataParallel's promise), printing their digest.
"""

import hashlib
import os

import numpy as np
import paddle
import paddle.distributed as dist

EPOCHS = int(os.environ.get("EPOCHS", "3"))
BATCHES = 8
BATCH = 32


def batches(rank: int, epoch: int):
    """This rank's shard of y = x @ w_true (a different seed per rank and epoch)."""
    rng = np.random.default_rng(1000 * epoch + rank)
    w_true = (np.arange(1, 9, dtype="float32") / 8).reshape(8, 1)
    for _ in range(BATCHES):
        x = rng.normal(size=(BATCH, 8)).astype("float32")
        yield paddle.to_tensor(x), paddle.to_tensor(x @ w_true)


def main() -> None:
    dist.init_parallel_env()
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank}/{world} on {os.environ.get('HOSTNAME', '?')}: training", flush=True)
    paddle.seed(0)  # same initial weights everywhere
    model = paddle.DataParallel(paddle.nn.Sequential(paddle.nn.Linear(8, 16), paddle.nn.Tanh(),
                                                     paddle.nn.Linear(16, 1)))
    optimizer = paddle.optimizer.SGD(learning_rate=0.05, parameters=model.parameters())
    for epoch in range(1, EPOCHS + 1):
        total = paddle.zeros([1])
        for x, y in batches(rank, epoch):
            loss = paddle.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.clear_grad()
            total += loss.detach()
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch} loss {total.item() / (BATCHES * world):.4f}", flush=True)
    flat = paddle.concat([p.detach().flatten() for p in model.parameters()])
    gathered: list = []
    dist.all_gather(gathered, flat)
    same = len(gathered) == world and all(bool(paddle.equal_all(flat, other)) for other in gathered)
    digest = hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16]
    print(f"final parameters digest {digest} identical-across-ranks={same}", flush=True)
    if not same:
        raise SystemExit("parameters differ across ranks")


if __name__ == "__main__":
    main()
