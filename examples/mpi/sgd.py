"""A small data-parallel training with mpi4py and NumPy, as a Kubeflow MPIJob (Horovod-style) would run it.

Linear regression by SGD: every rank draws its own shard of y = x @ w_true + noise, computes the gradient on it,
and the gradients are averaged with an allreduce, so every rank applies the same update and the weights stay
identical (the data-parallel promise, checked at the end with a digest gathered from every rank).
"""

import hashlib
import os
import socket
from collections import Counter

import numpy as np
from mpi4py import MPI

EPOCHS = int(os.environ.get("EPOCHS", "5"))
STEPS, BATCH, FEATURES, LR = 20, 32, 8, 0.1


def main() -> None:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    rng = np.random.default_rng(1000 + rank)  # each rank its own shard
    w_true = np.arange(1.0, FEATURES + 1) / FEATURES
    w = np.zeros(FEATURES)
    hosts = comm.gather(socket.gethostname(), root=0)
    if rank == 0:
        placement = ", ".join(f"{host}: {count}" for host, count in sorted(Counter(hosts).items()))
        print(f"training on {size} ranks ({placement})", flush=True)
    for epoch in range(1, EPOCHS + 1):
        loss = np.zeros(1)
        for _ in range(STEPS):
            x = rng.standard_normal((BATCH, FEATURES))
            y = x @ w_true + 0.01 * rng.standard_normal(BATCH)
            error = x @ w - y
            grad = x.T @ error / BATCH
            total = np.empty_like(grad)
            comm.Allreduce(grad, total, op=MPI.SUM)
            w -= LR * total / size
            loss += (error ** 2).mean()
        comm.Allreduce(MPI.IN_PLACE, loss, op=MPI.SUM)
        if rank == 0:
            print(f"epoch {epoch} loss {loss[0] / (STEPS * size):.5f}", flush=True)
    digest = hashlib.sha256(w.tobytes()).hexdigest()[:16]
    digests = comm.allgather(digest)
    same = len(set(digests)) == 1
    if rank == 0:
        error = float(np.abs(w - w_true).max())
        print(f"final weights digest {digest} identical-across-ranks={same} max-error={error:.4f}", flush=True)
    if not same:
        raise SystemExit(f"rank {rank}: weights differ across ranks")


if __name__ == "__main__":
    main()
