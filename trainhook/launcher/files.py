"""The one way trainhook writes a file that someone may be reading: through a temporary name and a rename; and the
launcher's private scratch directories (`private_directory`, `remove_tree`).

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


# Where tempfile looks, in its order (tempfile._candidate_tempdir_list), the working directory last.
TEMPORARY_VARIABLES = ("TMPDIR", "TEMP", "TMP")
TEMPORARY_PLACES = ("/tmp", "/var/tmp", "/usr/tmp")


def private_directory(prefix: str) -> str:
    """A new directory that only this user may enter, made where tempfile.mkdtemp would make it ($TMPDIR, $TEMP,
    $TMP, /tmp, /var/tmp, /usr/tmp, the working directory: the first where one can be made), its name `prefix` and
    12 random hex digits. Without tempfile: importing it (with shutil, bz2, lzma and weakref behind it) was ~3 ms
    of every launcher's start (issue 32). OSError when no place takes one (a read-only file system)."""
    places = [os.environ[v] for v in TEMPORARY_VARIABLES if os.environ.get(v)] + list(TEMPORARY_PLACES)
    try:
        places.append(os.getcwd())
    except OSError:  # the working directory is gone
        pass
    last: OSError = FileNotFoundError(f"no temporary directory among {places}")
    for place in places:
        for _ in range(16):  # a name taken: draw another (tempfile tries 10,000 times; 48 random bits need few)
            path = os.path.abspath(os.path.join(place, prefix + os.urandom(6).hex()))
            try:
                os.mkdir(path, 0o700)
                return path
            except FileExistsError as e:
                last = e
            except OSError as e:  # not there, not a directory, not writable: the next place
                last = e
                break
    raise last


def remove_tree(path: str) -> None:
    """Remove `path` and everything under it as far as it can, errors ignored (shutil.rmtree with ignore_errors,
    without importing shutil); a link is removed, never followed. Iterative: a training that nests directories
    deeply cannot exhaust the launcher's stack."""
    found: list = []
    pending = [path]
    while pending:
        directory = pending.pop()
        found.append(directory)
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            pending.append(entry.path)
                        else:
                            os.unlink(entry.path)
                    except OSError:
                        pass
        except OSError:
            pass
    for directory in reversed(found):  # every directory was found after the one holding it
        try:
            os.rmdir(directory)
        except OSError:
            pass
