"""An elastic DistributedDataParallel training: it keeps going while its StatefulSet is scaled within min..max.

torchrun's c10d rendezvous (flags from the PET_* variables trainhook injects) re-forms the training whenever a
node joins or leaves: every worker process is stopped and started again with the new world size. So the state
must live outside the processes: after every step, global rank 0 writes the model, the optimizer and the step
counter to CHECKPOINT_DIR (shared by every pod: a ReadWriteMany volume), atomically, and every process starts by
loading it. The step counter therefore continues across rendezvous rounds; it never starts again from 0.

What it prints (rank 0; the tests parse these lines):
    elastic: round R world W resumes at step S      once per rendezvous round (R: torchrun's restart count)
    elastic: step S world W loss L                  after every step
    elastic: done at step S world W                 when the last step is done
"""

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

STEPS = int(os.environ.get("STEPS", "60"))
STEP_SECONDS = float(os.environ.get("STEP_SECONDS", "0.3"))  # a real step takes time; this one pretends to
CHECKPOINT = Path(os.environ.get("CHECKPOINT_DIR", "/checkpoints")) / "elastic.pt"
BATCH = 32


def batch(step: int, rank: int):
    """Rank `rank`'s shard of step `step` of y = x @ w_true + noise: the same data whatever the world size."""
    generator = torch.Generator().manual_seed(step * 1000 + rank)
    w_true = torch.arange(1.0, 9.0).unsqueeze(1) / 8
    x = torch.randn(BATCH, 8, generator=generator)
    return x, x @ w_true + 0.01 * torch.randn(BATCH, 1, generator=generator)


def load(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """The step the last checkpoint ended at (0 without one), with the model and optimizer restored."""
    if not CHECKPOINT.exists():
        return 0
    state = torch.load(CHECKPOINT, weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])


def save(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    """Write the checkpoint so that a reader sees the old one or the new one, never half of one: a worker can
    be stopped at any moment by a rendezvous change."""
    partial = CHECKPOINT.with_name(f".{CHECKPOINT.name}.{os.getpid()}")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, partial)
    os.replace(partial, CHECKPOINT)


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = load(model, optimizer)
    # Everyone has read the checkpoint before rank 0 can write the next one, and they all resume from its step.
    agreed = torch.tensor([step])
    dist.broadcast(agreed, 0)
    step = int(agreed.item())
    ddp = DistributedDataParallel(model)  # broadcasts rank 0's parameters: every rank starts identical
    round_ = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if rank == 0:
        print(f"elastic: round {round_} world {world} resumes at step {step}", flush=True)
    while step < STEPS:
        x, y = batch(step, rank)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        optimizer.step()
        step += 1
        if rank == 0:
            save(model, optimizer, step)
            print(f"elastic: step {step} world {world} loss {loss.item():.4f}", flush=True)
        time.sleep(STEP_SECONDS)
    dist.barrier()  # nobody tears gloo down while a peer still has a collective in flight
    if rank == 0:
        print(f"elastic: done at step {step} world {world}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # As in ddp.py: torch's CPU gloo can abort in its C++ static destructors at exit, after the training is done.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
