"""`trainhook-launch run -- CMD ARGS`: run the training command as a well-behaved child of the container.

Why a wrapper at all: as a container's PID 1, a Python or shell training script gets no default signal
handling and nobody reaps its orphans' zombies; process.run_command forwards the usual signals, reaps as PID 1
and exits with the child's code, or 128+N when the child dies of signal N, as a shell does, because the contract
reads 128 and above as retryable and 1-127 as permanent.

In a gang (the webhook's TRAINHOOK_* variables are set), `run` is gang-aware: gang_run coordinates every
member's training (completion, failure, restarts) and runs each attempt as a process.Training. Outside a gang,
`run_command` runs the command alone, as it always did (its output goes straight to the container's). This
module is the command only; the process toolkit is process.py, so no other module needs to import a command.
"""

from __future__ import annotations

import os

from trainhook.gang import keys
from trainhook.launcher.process import run_command

TYPE_CHECKING = False  # typing's own, without importing typing (trainhook/launcher/__init__.py says why)
if TYPE_CHECKING:
    from typing import Mapping, Sequence


def run(argv: Sequence[str], env: Mapping[str, str] | None = None) -> int:
    """The `run` command: gang-aware inside a gang, `run_command` otherwise. Inside a gang-aware launcher's
    training (TRAINHOOK_ATTEMPT set), a nested `run` (`run -- trainhook-launch torchrun ...`) runs its command
    alone: the outer launcher already speaks for this member."""
    env = os.environ if env is None else env
    if not env.get(keys.TH_JOB_NAME, "").strip() or env.get(keys.TH_ATTEMPT, "").strip():
        return run_command(argv, None if env is os.environ else env)
    # the gang's machinery is only imported where it is used
    from trainhook.launcher.coordination import member_run
    return member_run.run_gang(argv, env)
