#!/usr/bin/env python3
"""Container images for the test node (hack/node.py), built on this machine: no registry is reachable, so
nothing is pulled, not even a base image.

    python hack/images.py build [NAME ...]   # build what is missing; print {name: reference} as JSON
    python hack/images.py list               # what `build` would produce, without building

| name     | what                                                                                       |
|----------|--------------------------------------------------------------------------------------------|
| base     | debootstrapped Debian bookworm (minbase) + python3, python3-venv, ca-certificates, `podman import` |
| pause    | the pod sandbox: hack/k8s-build.sh's static `pause` from the Kubernetes source, FROM scratch |
| webhook  | images/webhook.Dockerfile, unchanged, with --build-arg PYTHON_IMAGE=<base>                 |
| launcher | images/launcher.Dockerfile, likewise                                                       |
| torch    | images/examples/torch.Dockerfile: base + CPU torch, no trainhook (an example training image)|
| mpi      | images/examples/mpi.Dockerfile: base + Debian's OpenMPI, mpi4py and ssh, no trainhook (MPI training) |
| tensorflow | images/examples/tensorflow.Dockerfile: base + CPU TensorFlow, no trainhook                   |
| xgboost  | images/examples/xgboost.Dockerfile: base + xgboost-cpu, no trainhook                       |
| noshell  | base with every shell removed (sh, dash, bash): Python and no shell, as distroless and Chainguard are |
| bare     | noshell's removals and Python's too: neither shell nor Python                              |

Every image is keyed on its inputs (the Dockerfile, the files it copies, its base's key, the recipe below):
its reference is `localhost/trainhook/<name>:<key>` and its docker-archive is kept in
`${TRAINHOOK_CACHE:-~/.cache/trainhook}/images/<name>-<key>.tar`. An archive that exists is never rebuilt, so a
warm run costs a few hashes; an edit to the webhook's source gives a new tag, and the pods then run it.

Builds use buildah with `--isolation chroot` (its default OCI runtime, crun, refuses this machine's hybrid
cgroups) in a storage of their own under the cache, and mount the host's CA bundle read-only into RUN steps
(this machine's egress re-signs TLS; nothing of it is baked into an image). Debian packages needed: buildah,
podman, debootstrap (.ci/run installs them).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))  # node_host, beside this file
K8S_VERSION = "1.20.2"
SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates")
TORCH = "torch==2.13.0"
# The example training images (images/examples/<name>.Dockerfile): Python and one framework, nothing of trainhook.
EXAMPLES = ("torch", "mpi", "tensorflow", "xgboost")
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
# Bump to rebuild every image (a change in how they are built that no input shows).
RECIPE = "1"
SKIP_PARTS = {"__pycache__", ".pytest_cache", ".hypothesis"}
# Images without a shell (tests/e2e/test_e2e_shellless.py): the base with files removed, by its own Python in the
# exec form of RUN (no shell needed), which then checks that none of them is left on PATH. Removing files from the
# very base the other images use is honest and cheap (one layer of whiteouts): what stays is exactly a Debian
# Python image, minus its shells (and minus Python for `bare`).
SHELLS = ("sh", "dash", "bash", "rbash")
PYTHONS = ("python3", "python3.11", "python")
STRIPPED = {"noshell": SHELLS, "bare": SHELLS + PYTHONS}
SEARCHED = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SKIP_SUFFIXES = (".pyc", ".pyo")


class ImageError(RuntimeError):
    """An image could not be built or saved; the message holds the builder's last lines."""


@dataclass(frozen=True)
class Image:
    name: str
    key: str

    @property
    def ref(self) -> str:
        return f"localhost/trainhook/{self.name}:{self.key}"

    def archive(self, cache: Path) -> Path:
        return cache / f"{self.name}-{self.key}.tar"


# ---- keys (pure) ------------------------------------------------------------------------------------------------

def digest(*parts: str | bytes) -> str:
    """A short, stable hash of `parts` (each length-prefixed, so ("ab", "c") and ("a", "bc") differ)."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(f"{len(data)}:".encode())
        h.update(data)
    return h.hexdigest()[:16]


def copy_sources(dockerfile_text: str) -> list[str]:
    """The build-context paths a Dockerfile's COPY/ADD instructions read (not `COPY --from=<stage>`)."""
    sources: list[str] = []
    pending = ""
    for raw in dockerfile_text.splitlines():
        line = pending + raw
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        words = line.split()
        if not words or words[0].upper() not in ("COPY", "ADD"):
            continue
        args = [w for w in words[1:] if not w.startswith("--")]
        if any(w.startswith("--from") for w in words[1:]) or len(args) < 2:
            continue
        sources += args[:-1]
    return sources


def tree_files(root: Path, paths: list[str]) -> list[Path]:
    """Every file under `paths` (relative to `root`), sorted, without caches and bytecode."""
    files: list[Path] = []
    for rel in paths:
        path = root / rel
        candidates = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for p in candidates:
            parts = p.relative_to(root).parts
            if SKIP_PARTS.isdisjoint(parts) and not p.name.endswith(SKIP_SUFFIXES) \
                    and not any(part.endswith(".egg-info") for part in parts):
                files.append(p)
    return sorted(set(files))


def dockerfile_key(dockerfile: Path, base_key: str, extra: str = "") -> str:
    """The key of an image built from `dockerfile`: its text, every file it copies, its base's key."""
    text = dockerfile.read_text()
    parts: list[str | bytes] = [RECIPE, text, base_key, extra]
    for f in tree_files(REPO, copy_sources(text)):
        parts += [str(f.relative_to(REPO)), f.read_bytes()]
    return digest(*parts)


def stripped_containerfile(base_ref: str, programs: tuple[str, ...]) -> str:
    """FROM the base, remove `programs` from every directory of the default PATH, and fail the build if any is
    still found (the base's Python runs this, in the exec form of RUN: no shell is used)."""
    script = (f"import os, shutil\n"
              f"names, path = {programs!r}, {SEARCHED!r}\n"
              f"for d in path.split(':'):\n"
              f"    for n in names:\n"
              f"        p = os.path.join(d, n)\n"
              f"        if os.path.lexists(p):\n"
              f"            os.remove(p)\n"
              f"left = [n for n in names if shutil.which(n, path=path)]\n"
              f"assert not left, left\n")
    run = json.dumps(["/usr/bin/python3", "-I", "-c", script])
    return f"FROM {base_ref}\nRUN {run}\n"


def local_wheel_dirs(env: dict[str, str] | None = None) -> list[Path]:
    """The local wheel directories pip is configured with here (find-links in PIP_FIND_LINKS or pip's config):
    mounted into the torch build, so its CPU wheel comes from this disk when this machine has one."""
    env = os.environ if env is None else env
    values = env.get("PIP_FIND_LINKS", "").split()
    try:
        out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for line in out.splitlines():
        name, _, value = line.partition("=")
        if name.endswith("find-links"):
            values += value.strip().strip("'\"").split()
    dirs = []
    for value in values:
        path = Path(value.removeprefix("file://"))
        if value and not value.startswith(("http://", "https://")) and path.is_dir() and path not in dirs:
            dirs.append(path)
    return dirs


def plan(bin_dir: Path, wheel_dirs: list[Path]) -> dict[str, Image]:
    """Every image and its key, from the inputs alone (nothing is built)."""
    base = Image("base", digest(RECIPE, SUITE, *BASE_PACKAGES))
    pause_bin = bin_dir / "pause"
    pause = Image("pause", digest(RECIPE, pause_bin.read_bytes() if pause_bin.exists() else b"missing"))
    torch_wheels = sorted(f"{p.name}:{p.stat().st_size}" for d in wheel_dirs for p in d.glob("torch-*.whl"))
    images = {"base": base, "pause": pause}
    for name in ("webhook", "launcher"):
        images[name] = Image(name, dockerfile_key(REPO / "images" / f"{name}.Dockerfile", base.key))
    images["torch"] = Image("torch", dockerfile_key(REPO / "images" / "examples" / "torch.Dockerfile", base.key,
                                                    TORCH + " " + " ".join(torch_wheels)))
    for name in EXAMPLES[1:]:
        images[name] = Image(name, dockerfile_key(REPO / "images" / "examples" / f"{name}.Dockerfile", base.key))
    for name, programs in STRIPPED.items():
        images[name] = Image(name, digest(RECIPE, stripped_containerfile("BASE", programs), base.key))
    return images


# ---- building (I/O) ---------------------------------------------------------------------------------------------

class Builder:
    """buildah/podman in a storage of their own under the cache; a log per image."""

    def __init__(self, cache: Path, log=print):
        self.cache = cache
        self.storage = cache / "storage"
        # containers/storage keeps its locks and mount state in the runroot: one per storage, never shared.
        self.runroot = Path("/run") / f"trainhook-images-{digest(str(self.storage.resolve()))[:8]}"
        self.log = log

    def check_storage(self) -> None:
        """podman's own database (container state only: we keep no podman containers) records the runroot it was
        created with, and refuses another; a storage made under an older runroot naming gets a new database."""
        done = subprocess.run(["podman", *self._storage_args(), "images", "-q"], capture_output=True, text=True)
        if "database configuration mismatch" in done.stderr:
            (self.storage / "libpod" / "bolt_state.db").unlink(missing_ok=True)

    def _storage_args(self) -> list[str]:
        return ["--root", str(self.storage), "--runroot", str(self.runroot), "--storage-driver", "overlay"]

    def _tool(self, tool: str, *args: str, log_file: Path | None = None, **kw) -> subprocess.CompletedProcess:
        command = [tool, *self._storage_args(), *args]
        if log_file is None:
            return subprocess.run(command, capture_output=True, text=True, check=True, **kw)
        with log_file.open("a") as out:
            out.write(f"$ {' '.join(command)}\n")
            out.flush()
            done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, **kw)
        if done.returncode != 0:
            tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-40:])
            raise ImageError(f"{tool} {args[0]} failed (exit {done.returncode}); last lines of {log_file}:\n{tail}")
        return done

    def present(self, image: Image) -> bool:
        return subprocess.run(["podman", *self._storage_args(), "image", "exists", image.ref]).returncode == 0

    def ensure_in_storage(self, image: Image) -> None:
        """A base image other builds start FROM must be in the builder's storage: load its archive if not."""
        if not self.present(image):
            self._tool("podman", "load", "-i", str(image.archive(self.cache)))

    def save(self, image: Image, log_file: Path) -> Path:
        """docker-archive of `image` (what `ctr images import` reads), written atomically into the cache."""
        target = image.archive(self.cache)
        # A name of this process's own: two builds of the same image at once (two test sessions) must not
        # remove or rename each other's half-written archive; the last rename wins with identical content.
        part = target.with_suffix(f".tar.{os.getpid()}.part")
        part.unlink(missing_ok=True)
        self._tool("podman", "save", "--format", "docker-archive", "-o", str(part), image.ref, log_file=log_file)
        part.rename(target)
        self.prune(image)
        return target

    def prune(self, image: Image) -> None:
        """Keep the cache and the builder's storage to the current images: older archives and tags of this name
        go, and so do buildah's leftover working containers (1.28 leaves one per `FROM ... AS` stage that is only
        copied from). Untagged stage images younger than a day stay: they are the layer cache of the next build."""
        for old in self.cache.glob(f"{image.name}-*.tar"):
            if old != image.archive(self.cache):
                old.unlink()
        listing = self._tool("podman", "images", "--format", "{{.Repository}}:{{.Tag}}",
                             f"localhost/trainhook/{image.name}").stdout.split()
        stale = [ref for ref in listing if ref != image.ref and ref.startswith(f"localhost/trainhook/{image.name}:")]
        self._tool("buildah", "rm", "--all")
        if stale:
            subprocess.run(["podman", *self._storage_args(), "rmi", "--force", *stale], capture_output=True)
        subprocess.run(["podman", *self._storage_args(), "image", "prune", "--force", "--filter", "until=24h"],
                       capture_output=True)

    def build_base(self, image: Image, log_file: Path) -> None:
        mirror = os.environ.get("TRAINHOOK_DEBIAN_MIRROR", "http://deb.debian.org/debian")
        with tempfile.TemporaryDirectory(prefix="trainhook-rootfs-", dir=self.cache) as tmp:
            root = Path(tmp) / "rootfs"
            try:
                with log_file.open("a") as out:
                    subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
                                    SUITE, str(root), mirror], stdout=out, stderr=subprocess.STDOUT, check=True)
            finally:
                # debootstrap mounts /proc and /sys in the new root; an interrupted run leaves them there, and the
                # temporary directory must not be deleted through them.
                import node_host
                node_host.unmount_under(root)
            for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
                for p in (root / junk).glob("*"):
                    if p.is_file():
                        p.unlink()
            tar = subprocess.Popen(["tar", "-C", str(root), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE)
            self._tool("podman", "import", "--change", 'CMD ["python3"]',
                       "--change", "ENV LANG=C.UTF-8", "-", image.ref, stdin=tar.stdout, log_file=log_file)
            if tar.wait() != 0:
                raise ImageError("tar of the debootstrapped root failed")

    def build_pause(self, image: Image, bin_dir: Path, log_file: Path) -> None:
        with tempfile.TemporaryDirectory(prefix="trainhook-pause-") as tmp:
            shutil.copy2(bin_dir / "pause", Path(tmp) / "pause")
            (Path(tmp) / "Containerfile").write_text('FROM scratch\nCOPY pause /pause\nENTRYPOINT ["/pause"]\n')
            self._tool("buildah", "build", "--isolation", "chroot", "--pull=never", "-t", image.ref, tmp,
                       log_file=log_file)

    def build_containerfile(self, image: Image, text: str, log_file: Path) -> None:
        """An image from a Containerfile's text alone (nothing copied)."""
        with tempfile.TemporaryDirectory(prefix=f"trainhook-{image.name}-") as tmp:
            (Path(tmp) / "Containerfile").write_text(text)
            self._tool("buildah", "build", "--isolation", "chroot", "--pull=never", "-t", image.ref, tmp,
                       log_file=log_file)

    def build_dockerfile(self, image: Image, dockerfile: Path, build_args: dict[str, str], log_file: Path,
                         wheel_dirs: list[Path] = ()) -> None:
        volumes = [f"{HOST_CA}:{HOST_CA}:ro"] if HOST_CA.exists() else []
        volumes += [f"{d}:/wheels/{i}:ro" for i, d in enumerate(wheel_dirs)]
        args = ["build", "--isolation", "chroot", "--pull=never", "--layers", "-f", str(dockerfile), "-t", image.ref]
        for name, value in build_args.items():
            args += ["--build-arg", f"{name}={value}"]
        for v in volumes:
            args += ["-v", v]
        self._tool("buildah", *args, str(REPO), log_file=log_file)


def build(names: list[str], *, cache: Path, bin_dir: Path, log=print) -> dict[str, Image]:
    """Build the images named (and what they start FROM) unless their archives exist; return every image planned."""
    cache.mkdir(parents=True, exist_ok=True)
    wheel_dirs = local_wheel_dirs()
    images = plan(bin_dir, wheel_dirs)
    unknown = set(names) - set(images)
    if unknown:
        raise ImageError(f"unknown image(s) {sorted(unknown)}; known: {sorted(images)}")
    builder = Builder(cache, log)
    builder.check_storage()
    # What each image starts FROM (built first, and loaded into the builder's storage when only its archive is here).
    parents = {name: ["base"] for name in ("webhook", "launcher", *EXAMPLES, *STRIPPED)}
    wanted = set(names)
    for name in names:
        wanted |= set(parents.get(name, []))
    order = [n for n in images if n in wanted]
    for name in order:
        image = images[name]
        if image.archive(cache).exists():
            continue
        log_file = cache / f"{name}.log"
        log_file.write_text("")
        t0 = time.monotonic()
        log(f"images: building {image.ref} (log: {log_file})")
        if name == "base":
            builder.build_base(image, log_file)
        elif name == "pause":
            if not (bin_dir / "pause").exists():
                raise ImageError(f"no {bin_dir / 'pause'}: run `bash hack/k8s-build.sh node` first")
            builder.build_pause(image, bin_dir, log_file)
        elif name in STRIPPED:
            builder.ensure_in_storage(images["base"])
            builder.build_containerfile(image, stripped_containerfile(images["base"].ref, STRIPPED[name]), log_file)
        else:
            for parent in parents[name]:
                builder.ensure_in_storage(images[parent])
            examples = REPO / "images" / "examples"
            dockerfile = examples / f"{name}.Dockerfile" if name in EXAMPLES else \
                REPO / "images" / f"{name}.Dockerfile"
            build_args = {"PYTHON_IMAGE": images["base"].ref, "TORCH_IMAGE": images["torch"].ref,
                          "LAUNCHER_IMAGE": images["launcher"].ref}
            builder.build_dockerfile(image, dockerfile, build_args, log_file, wheel_dirs if name == "torch" else [])
        archive = builder.save(image, log_file)
        log(f"images: {name} built in {time.monotonic() - t0:.0f}s: {archive} "
            f"({archive.stat().st_size / 1e6:.0f} MB)")
    return images


def cache_dir() -> Path:
    return Path(os.environ.get("TRAINHOOK_CACHE") or Path.home() / ".cache" / "trainhook") / "images"


def k8s_bin_dir() -> Path:
    return Path(os.environ.get("TRAINHOOK_CACHE") or Path.home() / ".cache" / "trainhook") / \
        f"k8s-v{K8S_VERSION}" / "bin"


ALL = ["pause", "webhook", "launcher", *EXAMPLES, *STRIPPED]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build what is missing; print {name: reference}")
    b.add_argument("names", nargs="*", default=ALL, help=f"default: {' '.join(ALL)}")
    sub.add_parser("list", help="the references and archives `build` would produce")
    args = parser.parse_args(argv)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731  stdout is the JSON
    try:
        if args.command == "list":
            images = plan(k8s_bin_dir(), local_wheel_dirs())
        else:
            images = build(args.names, cache=cache_dir(), bin_dir=k8s_bin_dir(), log=log)
    except (ImageError, subprocess.CalledProcessError) as e:
        print(f"images: {e}", file=sys.stderr)
        return 1
    print(json.dumps({n: {"ref": i.ref, "archive": str(i.archive(cache_dir())),
                          "built": i.archive(cache_dir()).exists()} for n, i in images.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
