"""`trainhook-launch install DIR`: deliver the launcher into a pod, the way Argo's emissary and Tekton's entrypoint
deliver theirs.

The webhook gives every gang pod an emptyDir (keys.LAUNCHER_VOLUME) and has its init container run this into it
before anything else; the training container mounts it read-only and its command becomes
`/trainhook/bin/trainhook-launch run -- CMD`. What lands in DIR:

- `launcher.pyz`: a zip of the in-pod module set (trainhook/__init__.py, trainhook/gang/, trainhook/launcher/):
  standard library only and Python 3.8 compatible (tests/launcher/test_launcher_boundary.py holds both), so it runs on
  whatever Python the user's image has, in isolated mode (`-I`: no PYTHON* variable, no user site, no current
  directory on sys.path), and the training it starts gets the container's environment untouched.
- `bin/trainhook-launch`: the entry point, a static program (launcher/entry/trainhook-launch.c) that finds the
  image's python3 (or python) on PATH and execs it on the zip; with no Python on PATH it prints one line naming
  the fix and exits 127. A program, not a `#!/bin/sh` script, so that images without a shell (distroless,
  Chainguard) run it too: a script there fails with only "exec ...: no such file or directory".

Where the entry program comes from (`entry_program`): the images build it (images/*.Dockerfile, into PREBUILT);
elsewhere (a pip install, a checkout: `trainhook local`, the tests) it is compiled from its source once with the
machine's C compiler and cached; with no compiler at all, the old shell script SHIM stands in (it behaves the same
wherever there is a /bin/sh, which every machine running `trainhook local` has), and `install` says so.

The zip is made from the very modules the launcher image runs, so the two can never disagree. With bytecode it
costs ~44 ms of CPU to build, which the init container paid in every gang pod (issue 32: 32 init containers on a
node's 2 cores). So the launcher image builds it once (images/launcher.Dockerfile: `write_prebuilt`) into
PREBUILT_ZIP, beside a key of what it was built from (this Python's magic number and every in-pod source), and
`install` copies it when the key still matches the installed modules (reading ~40 small files and one hash,
about a millisecond); anywhere else, or after the modules changed, it builds the zip as before. Entries carry a
fixed timestamp, so the same modules always give the same bytes, prebuilt or not.

Bytecode beside the sources (issue 26): every training container's launcher imports its modules from the zip,
and a zip of sources alone made each one compile them all again: on a 2-core node where 25 launchers start at
once, that was most of a start's CPU (bench/launcher_start.py, docs/develop/performance.md). So each module's `.py`
has a `.pyc` beside it, compiled by the Python that builds the zip, where zipimport looks first. It is
hash-based and unchecked (PEP 552): no timestamp to go stale, and no hashing of the source at each import
(the zip is read-only and the pair is written together). An image whose Python has another magic number (another
minor version) finds a foreign header, ignores the .pyc and compiles the .py as before
(tests/launcher/test_delivery_bytecode.py runs both). The code objects name their files as the source would in a pod
(/trainhook/launcher.pyz/trainhook/launcher/run.py), so a traceback reads the same either way.

Not every module gets one: bytecode is about 2.2 times the size of its deflated source, and the zip and the entry
program share a ConfigMap's 1 MiB (webhook/launcher_configmap.py), where the entry is 20 KB built with musl but
680 KB where only glibc can link it statically. So SOURCE_ONLY names the modules no gang's `run` or `torchrun`
start imports (the MPI family, the API client, the gang wait the init container runs from its own image), which
compile as before; tests/launcher/test_delivery_bytecode.py checks that a member's and rank 0's start import
none of them.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import sys
from pathlib import Path

from trainhook.gang import keys
from trainhook.launcher.files import write_atomically

TYPE_CHECKING = False  # typing's own, without importing typing (trainhook/launcher/__init__.py says why)
if TYPE_CHECKING:
    import ast

# What only building the zip or compiling the entry program needs (ast, marshal, zipfile, subprocess, ...) is
# imported there: an init container that copies the prebuilt zip and program needs none of it.

ZIP_NAME = "launcher.pyz"
SHIM_NAME = "trainhook-launch"
FIXED_TIME = (2020, 1, 1, 0, 0, 0)
MIN_PYTHON = (3, 8)
FIX = (f"use an image with python3 {MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer on PATH, or opt the gang out with the "
       f"annotation {keys.LAUNCHER}: none (docs/use/delivery.md says what is lost)")

# Runs first under the image's Python, whatever its version: plain syntax, so an old Python reads it and says why.
MAIN = f'''import sys
if sys.version_info < {MIN_PYTHON!r}:
    sys.stderr.write("trainhook-launch: this image's Python is %d.%d; {FIX}\\n" % sys.version_info[:2])
    sys.exit(127)
from trainhook.launcher.cli import main
sys.exit(main())
'''

# The entry point where no compiled one can be had (no C compiler on a machine without the images): needs /bin/sh.
SHIM = f'''#!/bin/sh
# trainhook's delivered launcher: the image's own Python runs launcher.pyz (standard library only), isolated, no site.
for python in python3 python; do
  if command -v "$python" >/dev/null 2>&1; then
    exec "$python" -I -S "${{0%/bin/*}}/{ZIP_NAME}" "$@"
  fi
done
echo "trainhook-launch: no python3 or python on PATH in this image; {FIX}" >&2
exit 127
'''


# Modules of the in-pod set shipped without bytecode (see the module docstring), by their name in the zip: none is
# imported by a gang's `run` or `torchrun` start, and together they are 40% of the bytecode's size.
SOURCE_ONLY = ("trainhook/launcher/mpi/", "trainhook/launcher/wait/", "trainhook/launcher/deliver.py",
               "trainhook/launcher/tf_config.py", "trainhook/gang/wiring.py")


def source_only(name: str) -> bool:
    """Whether the zip's entry `name` goes without its .pyc: a module SOURCE_ONLY names, or one of a package it
    names."""
    return any(name == entry or (entry.endswith("/") and name.startswith(entry)) for entry in SOURCE_ONLY)

ENTRY_SOURCE = Path(__file__).resolve().parent / "entry" / "trainhook-launch.c"
# The images' build (images/*.Dockerfile) and compile_entry use these; tests/repo/test_images.py holds them together.
ENTRY_FLAGS = ("-static", "-Os", "-s")
COMPILERS = ("musl-gcc", "cc", "gcc")  # musl first: a 20 KB program instead of glibc's 700 KB
# Where the images put the program they built: beside the environment trainhook is installed in (/opt/trainhook).
PREBUILT = Path(sys.prefix) / "libexec" / "trainhook" / SHIM_NAME
PREBUILT_ZIP = Path(sys.prefix) / "share" / "trainhook" / ZIP_NAME  # the images' zip; its key beside it (+ ".key")


def is_program(entry: bytes) -> bool:
    """Whether an entry point is the compiled program (an ELF file) rather than the shell script."""
    return entry[:4] == b"\x7fELF"


def compile_entry(target: Path, compiler: str) -> Path:
    """Compile the entry program into `target` with `compiler`, as the images do; CalledProcessError if it fails."""
    import subprocess
    subprocess.run([compiler, *ENTRY_FLAGS, "-o", str(target), str(ENTRY_SOURCE)], check=True,
                   capture_output=True, timeout=120)
    return target


def _cache_dir() -> Path | None:
    root = os.environ.get("TRAINHOOK_CACHE")
    try:
        return Path(root or Path.home() / ".cache" / "trainhook") / "entry"
    except RuntimeError:  # no home directory to find
        return None


@functools.lru_cache(maxsize=None)
def entry_program() -> bytes:
    """The bytes of bin/trainhook-launch: the images' prebuilt program, else one compiled here (cached by its
    source, flags and compiler), else SHIM. The same in every call of a process (the webhook hashes it)."""
    if PREBUILT.is_file():
        return PREBUILT.read_bytes()
    import shutil
    import subprocess
    import tempfile
    compiler = next((found for name in COMPILERS for found in [shutil.which(name)] if found), None)
    if compiler is None or not ENTRY_SOURCE.is_file():
        return SHIM.encode()
    key = hashlib.sha256(ENTRY_SOURCE.read_bytes() + repr((ENTRY_FLAGS, compiler)).encode()).hexdigest()[:16]
    cache = _cache_dir()
    cached = cache / f"{SHIM_NAME}-{key}" if cache is not None else None
    if cached is not None and cached.is_file():
        return cached.read_bytes()
    try:
        with tempfile.TemporaryDirectory(prefix="trainhook-entry-") as tmp:
            built = compile_entry(Path(tmp) / SHIM_NAME, compiler).read_bytes()
    except (OSError, subprocess.SubprocessError):
        return SHIM.encode()  # a compiler that cannot link statically (no libc.a): the script still works here
    if cached is not None:
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(cached, built, 0o755)
        except OSError:
            pass  # a read-only home: compiled again next time
    return built


def self_command() -> list[str]:
    """The command line that starts this launcher again (the MPI rsh agent's script calls it): the delivered
    zip with this very Python, isolated, when running from one; else the installed package."""
    for parent in Path(os.path.abspath(__file__)).parents:
        if parent.suffix == ".pyz":
            return [sys.executable, "-I", "-S", str(parent)]
    return [sys.executable, "-m", "trainhook.launcher.cli"]


def in_pod_modules() -> list[tuple[str, Path]]:
    """(name in the zip, source file) for every module of the in-pod set, in a stable order: trainhook/__init__.py,
    then every module of trainhook/gang/ and trainhook/launcher/ with their subpackages."""
    import trainhook
    top = Path(trainhook.__file__).parent
    files = [("trainhook/__init__.py", top / "__init__.py")]
    for package in ("gang", "launcher"):
        files += [(f"trainhook/{path.relative_to(top).as_posix()}", path)
                  for path in sorted((top / package).rglob("*.py")) if "__pycache__" not in path.parts]
    return files


MARSHAL_VERSION = 2  # see bytecode(): the newest format whose bytes do not depend on the building process


def without_docstrings(source: bytes) -> ast.Module:
    """The module's syntax tree without its docstrings, for its bytecode only: they are a third of the zip, which
    every pod's ConfigMap carries beside the entry program (1 MiB at most), and nothing reads them at run time. The
    source beside the bytecode keeps them, and every line keeps its number, so a traceback still shows the code.
    Asserts stay (compile's optimize=2 would drop them too)."""
    import ast
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                node.body[:1] = [] if len(node.body) > 1 else [ast.copy_location(ast.Pass(), first)]
    return tree


def bytecode(name: str, source: bytes) -> bytes:
    """The unchecked hash-based .pyc (PEP 552) of the zip's entry `name`, for this Python: its magic number,
    flags 1 (hash-based, not checked against the source), the source's hash, then the marshalled code. The same
    source gives the same bytes (tests/launcher/test_delivery_bytecode.py: in a fresh process too, so every webhook
    replica names the same ConfigMap)."""
    import marshal
    code = compile(without_docstrings(source), f"{keys.LAUNCHER_DIR}/{ZIP_NAME}/{name}", "exec", dont_inherit=True)
    # Marshal format 2: the current format (4) marks a string "interned" and "shared" by the state of this
    # process (a one-character string such as '?' is interned once any code in the process interned it), so a
    # webhook that had run for a while wrote other bytes than a fresh one, and another ConfigMap name. Format 2
    # writes neither mark; the loader interns names as it builds each code object, so the code is the same.
    return (importlib.util.MAGIC_NUMBER + (1).to_bytes(4, "little") + importlib.util.source_hash(source)
            + marshal.dumps(code, MARSHAL_VERSION))


CONFIGMAP_BYTES = 1 << 20  # the API server refuses a ConfigMap whose data and binaryData hold more than 1 MiB


def build_zip(bytecode_too: bool = True, stored: bool | None = None) -> bytes:
    """The launcher zip's bytes: the in-pod modules and a __main__ that checks the Python version first, each
    source with its .pyc beside it (`bytecode_too`; False gives the sources alone, for comparison).

    The bytecode is stored, not deflated: zipimport inflates every module a start imports, and that was ~3 ms of
    each launcher start's CPU (9%, issue 32), for a zip of ~620 KB instead of ~350. Where the entry program is too
    large for both to fit the launcher ConfigMap (a glibc static build, ~680 KB, against musl's ~20 KB) the
    bytecode is deflated (`stored` None: chosen so, the same choice in the webhook and the init container; True
    or False forces it). The sources, read only for a traceback, are always deflated."""
    import io
    import zipfile
    entries = []
    for name, path in [("__main__.py", None), *in_pod_modules()]:
        source = MAIN.encode() if path is None else path.read_bytes()
        entries.append((name, source))
        if bytecode_too and not source_only(name):
            entries.append((name + "c", bytecode(name, source)))

    def written(store: bool) -> bytes:
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            for entry, data in entries:
                info = zipfile.ZipInfo(entry, FIXED_TIME)
                info.compress_type = zipfile.ZIP_STORED if store and entry.endswith(".pyc") else zipfile.ZIP_DEFLATED
                info.external_attr = 0o644 << 16
                archive.writestr(info, data)
        return buffer.getvalue()

    if stored is not None:
        return written(stored)
    fast = written(True)
    return fast if len(fast) + len(entry_program()) <= CONFIGMAP_BYTES else written(False)


def sources_key() -> str:
    """What build_zip's bytes follow from, hashed: this Python's magic number (the bytecode's), the marshal format,
    __main__ and every in-pod module's name and source."""
    digest = hashlib.sha256(importlib.util.MAGIC_NUMBER + bytes([MARSHAL_VERSION]) + MAIN.encode())
    for name, path in in_pod_modules():
        source = path.read_bytes()
        digest.update(b"%d:%s%d:" % (len(name), name.encode(), len(source)) + source)
    return digest.hexdigest()


def write_prebuilt(target: Path = PREBUILT_ZIP) -> Path:
    """Build the zip once into `target` with its key beside it (the launcher image's build runs this)."""
    write_atomically(target, build_zip(), 0o644)
    write_atomically(Path(f"{target}.key"), sources_key().encode(), 0o644)
    return target


def prebuilt_zip(target: Path | None = None) -> bytes | None:
    """The prebuilt zip's bytes (PREBUILT_ZIP's by default) when its key matches the installed modules, else None
    (build it)."""
    target = PREBUILT_ZIP if target is None else target
    try:
        key = Path(f"{target}.key").read_text().strip()
        if key != sources_key():
            return None
        return target.read_bytes()
    except OSError:
        return None


def install(directory: Path) -> Path:
    """Write the launcher into `directory` (the pod's launcher volume): the prebuilt zip when it is current, else
    one built now; returns the entry point's path."""
    (directory / "bin").mkdir(parents=True, exist_ok=True)
    write_atomically(directory / ZIP_NAME, prebuilt_zip() or build_zip(), 0o644)
    entry = directory / "bin" / SHIM_NAME
    write_atomically(entry, entry_program(), 0o755)
    return entry


def main(directory: str) -> int:
    try:
        shim = install(Path(directory))
    except OSError as e:
        print(f"trainhook-launch install: cannot write the launcher to {directory}: {e.strerror or e} (the "
              f"webhook mounts the emptyDir {keys.LAUNCHER_VOLUME} there; is the pod admitted?)", file=sys.stderr)
        return 1
    kind = ("a static program" if is_program(entry_program()) else "a /bin/sh script: no compiled entry point "
            "here (no C compiler), so images without a shell cannot run it; docs/use/delivery.md")
    print(f"trainhook-launch install: {shim} ({kind})", file=sys.stderr)
    return 0
