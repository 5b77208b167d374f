"""`trainhook-launch install DIR`: deliver the launcher into a pod, the way Argo's emissary and Tekton's entrypoint
deliver theirs.

The webhook gives every gang pod an emptyDir (keys.LAUNCHER_VOLUME) and has its init container run this into it
before anything else; the training container mounts it read-only and its command becomes
`/trainhook/bin/trainhook-launch run -- CMD`. What lands in DIR:

- `launcher.pyz`: a zip of the in-pod module set (trainhook/__init__.py, trainhook/keys.py, trainhook/launcher/):
  standard library only and Python 3.8 compatible (tests/test_launcher_boundary.py holds both), so it runs on
  whatever Python the user's image has, in isolated mode (`-I`: no PYTHON* variable, no user site, no current
  directory on sys.path), and the training it starts gets the container's environment untouched.
- `bin/trainhook-launch`: a POSIX shell script that finds the image's python3 (or python) on PATH and runs the
  zip with it; with no Python on PATH it prints one line naming the fix and exits 127.

Why build the zip here rather than ship one in the image: it is made from the very modules the launcher image
runs, so the two can never disagree, and it costs a few milliseconds (tests/test_delivery.py measures it).
Entries carry a fixed timestamp, so the same modules always give the same bytes.
"""

from __future__ import annotations

import io
import os
import sys
import zipfile
from pathlib import Path

from trainhook import keys

ZIP_NAME = "launcher.pyz"
SHIM_NAME = "trainhook-launch"
FIXED_TIME = (2020, 1, 1, 0, 0, 0)
MIN_PYTHON = (3, 8)
FIX = (f"use an image with python3 {MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer on PATH, or opt the gang out with the "
       f"annotation {keys.LAUNCHER}: none (docs/delivery.md says what is lost)")

# Runs first under the image's Python, whatever its version: plain syntax, so an old Python reads it and says why.
MAIN = f'''import sys
if sys.version_info < {MIN_PYTHON!r}:
    sys.stderr.write("trainhook-launch: this image's Python is %d.%d; {FIX}\\n" % sys.version_info[:2])
    sys.exit(127)
from trainhook.launcher.cli import main
sys.exit(main())
'''

SHIM = f'''#!/bin/sh
# trainhook's delivered launcher: the image's own Python runs launcher.pyz (standard library only), isolated.
for python in python3 python; do
  if command -v "$python" >/dev/null 2>&1; then
    exec "$python" -I "${{0%/bin/*}}/{ZIP_NAME}" "$@"
  fi
done
echo "trainhook-launch: no python3 or python on PATH in this image; {FIX}" >&2
exit 127
'''


def self_command() -> list[str]:
    """The command line that starts this launcher again (the MPI rsh agent's script calls it): the delivered
    zip with this very Python, isolated, when running from one; else the installed package."""
    for parent in Path(os.path.abspath(__file__)).parents:
        if parent.suffix == ".pyz":
            return [sys.executable, "-I", str(parent)]
    return [sys.executable, "-m", "trainhook.launcher.cli"]


def in_pod_modules() -> list[tuple[str, Path]]:
    """(name in the zip, source file) for every module of the in-pod set, in a stable order."""
    import trainhook
    import trainhook.launcher
    top = Path(trainhook.__file__).parent
    launcher = Path(trainhook.launcher.__file__).parent
    files = [("trainhook/__init__.py", top / "__init__.py"), ("trainhook/keys.py", top / "keys.py")]
    files += [(f"trainhook/launcher/{path.name}", path) for path in sorted(launcher.glob("*.py"))]
    return files


def build_zip() -> bytes:
    """The launcher zip's bytes: the in-pod modules and a __main__ that checks the Python version first."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, source in [("__main__.py", None), *in_pod_modules()]:
            info = zipfile.ZipInfo(name, FIXED_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, MAIN if source is None else source.read_bytes())
    return buffer.getvalue()


def write_file(path: Path, data: bytes, mode: int) -> None:
    """Write through a temporary name and rename, so a container never sees a half-written launcher (an init
    container restarted mid-copy writes it again)."""
    partial = path.with_name(f".{path.name}.partial")
    with open(partial, "wb") as out:
        out.write(data)
    os.chmod(partial, mode)
    os.replace(partial, path)


def install(directory: Path) -> Path:
    """Write the launcher into `directory` (the pod's launcher volume); returns the shim's path."""
    (directory / "bin").mkdir(parents=True, exist_ok=True)
    write_file(directory / ZIP_NAME, build_zip(), 0o644)
    shim = directory / "bin" / SHIM_NAME
    write_file(shim, SHIM.encode(), 0o755)
    return shim


def main(directory: str) -> int:
    try:
        shim = install(Path(directory))
    except OSError as e:
        print(f"trainhook-launch install: cannot write the launcher to {directory}: {e.strerror or e} (the "
              f"webhook mounts the emptyDir {keys.LAUNCHER_VOLUME} there; is the pod admitted?)", file=sys.stderr)
        return 1
    print(f"trainhook-launch install: {shim}", file=sys.stderr)
    return 0
