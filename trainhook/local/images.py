"""What a container's image gives it locally, where images are not pulled.

A kubelet runs a container with its image's files and nothing else: a user's training image has its Python and
its framework, and no trainhook (the webhook delivers the launcher through a volume). Locally every container
runs on this machine with the current Python environment, so that environment stands in for the images, but
only the part an image would have: `image_bin` makes a folder with this Python (`python`, `python3`) and the
environment's commands (`torchrun`, ...), without trainhook's own commands, and that folder heads a training
container's PATH instead of the environment's bin folder. The containers the webhook injects run the launcher
image, which does contain trainhook: they keep the environment's bin folder (`runs_launcher_image`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from trainhook.gang import keys

# Console scripts of this project (pyproject's [project.scripts]) and the venv's own helpers: not in an image.
NOT_IN_IMAGES = ("trainhook", "trainhook-launch", "trainhook-webhook", "activate", "Activate.ps1")
PYTHON_NAMES = ("python", "python3", f"python3.{sys.version_info[1]}")


def runs_launcher_image(container: dict) -> bool:
    """The containers the webhook injects, which run the launcher image."""
    return container.get("name") == keys.GANG_WAIT_CONTAINER


def python_wrapper() -> str:
    """A script, not a link: a link to a venv's python leaves the venv (CPython finds pyvenv.cfg next to the
    path it was started by)."""
    return f'#!/bin/sh\nexec {sys.executable} "$@"\n'


def image_bin(run_dir: Path, own_bin: str | None = None) -> Path:
    """RUN_DIR/image-bin: this Python and the environment's commands, minus trainhook's (made once per run)."""
    folder = run_dir / "image-bin"
    if folder.is_dir():
        return folder
    own = Path(own_bin or os.path.dirname(sys.executable))
    partial = run_dir / ".image-bin.partial"
    partial.mkdir(parents=True, exist_ok=True)
    for name in PYTHON_NAMES:
        script = partial / name
        script.write_text(python_wrapper())
        script.chmod(0o755)
    for entry in sorted(own.iterdir()):
        name = entry.name
        if name in NOT_IN_IMAGES or name.startswith(("activate", "python", "trainhook")):
            continue
        if os.access(entry, os.X_OK) and entry.is_file():
            (partial / name).symlink_to(entry)
    partial.rename(folder)
    return folder
