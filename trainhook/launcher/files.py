"""The one way trainhook writes a file that someone may be reading: through a temporary name and a rename.

A container may start on the launcher while an init container restarted mid-copy writes it again; mpirun may read
the rsh agent while a second launcher attempt rewrites it; a `trainhook local` runner reads the outcome marker while
the launcher writes it; the webhook serves the certificate files while it renews them. Each reader must see the
old file or the new one, never half of one. Used by the launcher (deliver, ending, mpi/kubexec) and the webhook
(selfcerts, notary/local); the standard library only, as the rest of the in-pod set. Paths are str or
os.PathLike, handled with os.path: pathlib (with urllib.parse behind it) was ~2 ms of every launcher's start.
"""

from __future__ import annotations

import json
import os

TYPE_CHECKING = False  # typing's own, without importing typing (trainhook/launcher/__init__.py says why)
if TYPE_CHECKING:
    from typing import Optional, Union
    from os import PathLike

    AnyPath = Union[str, "PathLike[str]"]


def write_atomically(path: AnyPath, data: bytes, mode: int = 0o644) -> None:
    """Write `data` to `path` with `mode` (exactly, whatever the umask, and from the file's first byte: a key is
    never readable by others even for a moment). The temporary name carries this process's id, so two processes
    writing the same path never share one; it is created afresh (never through a link someone left there) and
    removed when the write fails. OSError on failure."""
    path = os.fspath(path)
    directory, name = os.path.split(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    temporary = os.path.join(directory, f".{name}.{os.getpid()}.partial")
    try:
        os.unlink(temporary)
    except FileNotFoundError:
        pass
    try:
        with open(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode), "wb") as out:
            out.write(data)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


def write_json_atomically(path: AnyPath, data: object, indent: Optional[int] = None) -> None:
    """`data` as JSON, written as write_atomically writes (the launcher's outcome marker, `trainhook local`'s
    control files, the local notary's records)."""
    write_atomically(path, json.dumps(data, indent=indent).encode())
