"""The gang-start benchmark's training script: gloo, a tiny model, one step.

Prints wall-clock timestamps (time.time(), one clock for every process on the machine) as it goes:
    GANGSTART rank=R imported=T process_group=T loop=T
`loop` is taken at the top of the first training iteration: the rank is inside its training loop.
Started by torchrun (env:// rendezvous from MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE), as a user's script is.
GANG_TRAIN_HOLD=S keeps every rank up S seconds after the step (bench/node_start.py reads the pods' logs before a
finished gang's pods are deleted).
"""

import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

IMPORTED = time.time()


def main() -> None:
    dist.init_process_group("gloo")
    grouped = time.time()
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1):
        if step == 0:
            print(f"GANGSTART rank={rank} imported={IMPORTED:.6f} process_group={grouped:.6f} "
                  f"loop={time.time():.6f}", flush=True)
        optimizer.zero_grad()
        loss = model(torch.ones(2, 4)).pow(2).mean()
        loss.backward()  # DDP all-reduces the gradients: every rank takes part
        optimizer.step()
    dist.barrier()
    time.sleep(float(os.environ.get("GANG_TRAIN_HOLD", "0")))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
