"""How the launcher's commands speak: one line, `trainhook-launch[ COMMAND]: message`, in a single write.

Why a module of its own: every command (run, its coordinator, the gang wait, the MPI commands, the notary's
client) prints its lines the same way, and a line must reach the container's log whole even when threads speak
at once (one write, flushed). Each module makes its own `say` here, named by its command, so the prefix tells a
reader of a pod's log which part of the launcher spoke.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing's own, without importing typing (trainhook/launcher/__init__.py says why)
if TYPE_CHECKING:
    from typing import Callable


def speaker(command: str = "", to_stdout: bool = False) -> Callable[..., None]:
    """A `say(message, err=...)` for `command` ("" for the launcher as a whole): stderr unless `to_stdout` (the
    gang wait's progress goes to stdout, its failures to stderr with err=True). The stream is looked up at each
    call, so a replaced sys.stderr (pytest's capture) sees the line."""
    prefix = f"trainhook-launch {command}: " if command else "trainhook-launch: "

    def say(message: str, err: bool = not to_stdout) -> None:
        stream = sys.stderr if err else sys.stdout
        stream.write(f"{prefix}{message}\n")  # one write: threads' lines never interleave
        stream.flush()

    return say
