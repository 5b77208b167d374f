"""What one launcher's start costs in CPU: the delivered zip under the image's Python, up to its first gang contact.

Issue 26: a 32-pod bare gang on a 2-core node starts seconds after the same pods wired by hand, and part of it
is each training container's launcher: 25 launchers starting at once on 2 cores took ~3.5 s to print their first
line. A start is CPU (imports, compiling, the notary's TLS), so this counts CPU (user + sys of the launcher
process alone, from wait4) and wall per start, one start at a time on an idle machine as far as it can be.

What a start is here: `PYTHON -I -S launcher.pyz run -- true` (as the entry program execs it) with the environment
the webhook gives a pod of a 4-pod PyTorch Job (tests/support/gang_notary.py: the real webhook and notary on
loopback, each pod's own identity token), up to the launcher's first word about the gang's coordinator, then SIGKILL:
- a member (rank 1): it asked the notary for the gang's key (HTTPS), then tried rank 0 (`cannot reach the gang's
  coordinator`: rank 0's name does not resolve on this host);
- rank 0: it asked the notary for the key and the recorded outcome, started its coordinator and joined it over
  loopback (`joined the gang's coordinator`).
Also: `PYTHON -I -c pass`, and the same stdlib modules a member imports without the launcher's own (the floor a
start cannot go under), the zip's size, and which of our modules each role imported (`-X importtime`).

    .venv/bin/python bench/launcher_start.py [--starts 30] [--python /usr/bin/python3] [--zip PATH] [--no-bytecode]

`--zip A.pyz --flags=-I --zip B.pyz --flags="-I -S"`: each zip under the interpreter flags its own entry program
used (the entry execs `-I -S` since issue 32's fourth round, `-I` before); default `-I -S` for every zip.

`--install N`: instead, the init container's delivery (`deliver.install`, issue 32) N times each way, interleaved,
CPU of this process (time.process_time): building the zip in the pod, as before, and copying the one the launcher
image prebuilt (its key checked against the modules first).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))

from gang_notary import GangNotary, indexed_job  # noqa: E402
from webhook_process import free_port  # noqa: E402

from trainhook.launcher import deliver  # noqa: E402

MARKERS = {"member": "the gang's coordinator", "rank 0": "joined the gang's coordinator"}
# -X importtime lists the imports a module tries and misses too (nt, msvcrt on Linux): tried the same way.
STDLIB_ALONE = '''for name in {!r}:
    try:
        __import__(name)
    except ImportError:
        pass
'''
IMPORT_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")



def start(command: list[str], env: dict[str, str], marker: str | None) -> tuple[float, float, str]:
    """(CPU seconds, wall seconds, stderr) of one process up to the line holding `marker` (None: to its exit)."""
    began = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    lines = []
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append(line)
        if marker is not None and marker in line and not line.startswith("import time:"):
            break
    wall = time.perf_counter() - began
    if marker is not None:
        proc.send_signal(signal.SIGKILL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0
    proc.stderr.close()
    text = "".join(lines)
    if marker is not None and marker not in text:
        raise SystemExit(f"no {marker!r} in the launcher's output (status {status}):\n{text}")
    return usage.ru_utime + usage.ru_stime, wall, text


def imported(stderr: str) -> list[tuple[str, int]]:
    """(module, self microseconds) from `-X importtime`, in import order."""
    return [(m.group(4), int(m.group(1))) for m in map(IMPORT_LINE.match, stderr.splitlines()) if m]


def summary(samples: list[tuple[float, float]]) -> dict:
    cpu, wall = [s[0] for s in samples], [s[1] for s in samples]
    return {"cpu_ms": round(statistics.median(cpu) * 1000, 1), "cpu_min_ms": round(min(cpu) * 1000, 1),
            "wall_ms": round(statistics.median(wall) * 1000, 1), "starts": len(samples)}


def install_cost(times: int) -> dict:
    """CPU ms of deliver.install into a fresh directory: the zip built there, or the prebuilt one copied."""
    with tempfile.TemporaryDirectory(prefix="launcher-install-") as tmp_name:
        tmp = Path(tmp_name)
        prebuilt = deliver.write_prebuilt(tmp / "share" / deliver.ZIP_NAME)
        samples: dict[str, list[float]] = {"built in the pod": [], "prebuilt, copied": []}
        for i in range(times):
            for way, target in (("built in the pod", tmp / "none" / deliver.ZIP_NAME), ("prebuilt, copied", prebuilt)):
                deliver.PREBUILT_ZIP = target
                began = time.process_time()
                deliver.install(tmp / f"pod-{i}-{way[:5]}")
                samples[way].append(time.process_time() - began)
        built, copied = ((tmp / pod / deliver.ZIP_NAME).read_bytes() for pod in ("pod-0-built", "pod-0-prebu"))
        same = built == copied
    return {"same zip": same, **{way: {"cpu_ms": round(statistics.median(s) * 1000, 1),
                                       "cpu_min_ms": round(min(s) * 1000, 1), "n": len(s)}
                                 for way, s in samples.items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=30)
    parser.add_argument("--python", default="/usr/bin/python3", help="the image's Python (Debian 3.11 on the node)")
    parser.add_argument("--zip", type=Path, action="append",
                        help="a launcher.pyz to measure instead of deliver.build_zip()'s (repeat: compared, "
                             "interleaved; each is labelled by its file name)")
    parser.add_argument("--flags", action="append",
                        help="the interpreter flags of the --zip before it (repeat, one a --zip; default '-I -S')")
    parser.add_argument("--no-bytecode", action="store_true", help="build the zip with sources only")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--install", type=int, metavar="N", help="time the init container's delivery instead")
    args = parser.parse_args()
    if args.install:
        print(json.dumps(install_cost(args.install), indent=1))
        return 0
    with tempfile.TemporaryDirectory(prefix="launcher-start-") as tmp_name:
        tmp = Path(tmp_name)
        zips, flags = {}, {}
        given_flags = args.flags or []
        for index, given in enumerate(args.zip or [None]):
            label = given.stem if given else "bytecode" if not args.no_bytecode else "sources"
            launcher = tmp / label / deliver.ZIP_NAME
            launcher.parent.mkdir()
            # as the images deliver it: their entry program is musl's, so the bytecode is stored (deliver.build_zip)
            launcher.write_bytes(given.read_bytes() if given else deliver.build_zip(bytecode_too=not args.no_bytecode,
                                                                                    stored=True))
            zips[label] = launcher
            flags[label] = (given_flags[index] if index < len(given_flags) else "-I -S").split()
        python = subprocess.run([args.python, "-VV"], capture_output=True, text=True).stdout.strip()
        results: dict = {"python": python, "starts": args.starts}
        base = {"PATH": "/usr/bin:/bin"}
        with GangNotary(tmp / "run") as notary:
            pods = notary.admit(indexed_job("g", "team-a", completions=4, command=["true"]))
            envs = {}
            for role, pod in (("rank 0", pods[0]), ("member", pods[1])):
                envs[role] = {**notary.env(pod), **base, "TRAINHOOK_COORDINATOR_PORT": str(free_port())}
            commands = {label: [args.python, *flags[label], str(launcher), "run", "--", "true"]
                        for label, launcher in zips.items()}
            stdlib: dict[str, list[str]] = {}
            for label, command in commands.items():
                entries = zipfile.ZipFile(zips[label]).namelist()
                about = results[label] = {"zip_bytes": zips[label].stat().st_size,
                                          "pyc_entries": sum(e.endswith(".pyc") for e in entries)}
                for role, env in envs.items():  # which modules, once, with -X importtime (not counted)
                    _, _, text = start([args.python, "-X", "importtime", *command[1:]], env, MARKERS[role])
                    mods = imported(text)
                    ours = [(name, us) for name, us in mods if name.startswith("trainhook")]
                    about[f"{role} modules"] = " ".join(name.rpartition(".")[2] for name, _ in ours)
                    stdlib[role] = sorted({name for name, _ in mods if not name.startswith("trainhook")})
                    about[f"{role} stdlib modules"] = len(stdlib[role])
                    about[f"{role} heaviest (self ms, under -X importtime)"] = " ".join(
                        f"{name}={us / 1000:.1f}" for name, us in sorted(mods, key=lambda m: -m[1])[:12])
            floors = {"python -I -c pass": [args.python, "-I", "-c", "pass"],
                      "the last member's stdlib imports alone": [args.python, "-I", "-c", STDLIB_ALONE.format(
                          stdlib["member"])]}
            samples: dict[str, list] = {name: [] for name in floors}
            samples.update({f"{label}: {role}": [] for label in commands for role in envs})
            for _ in range(args.starts):  # interleaved, so a busy moment costs every kind alike
                for name, floor in floors.items():
                    cpu, wall, _ = start(floor, base, None)
                    samples[name].append((cpu, wall))
                for label, command in commands.items():
                    for role, env in envs.items():
                        cpu, wall, _ = start(command, env, MARKERS[role])
                        samples[f"{label}: {role}"].append((cpu, wall))
            results["per start"] = {name: summary(s) for name, s in samples.items()}
    print(json.dumps(results, indent=1))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
