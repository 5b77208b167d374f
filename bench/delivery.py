"""Delivery benchmark: what the delivered launcher costs a pod (docs/use/delivery.md).

- `install`: building the zip and writing it and the entry point into a folder, in this process (the init
  container's extra work), median of --repeat runs;
- the init container's process: `trainhook-launch wait --mode none --install DIR` against `wait --mode none`
  alone, median of --repeat runs each, interleaved;
- the training container's start: `DIR/bin/trainhook-launch run -- true` (the entry point, a static program that
  execs the image's Python on the zip: docs/use/delivery.md) against `python3 -I -c pass`, interleaved; `entry` says
  whether this machine's install wrote that program or, with no C compiler here, the old `#!/bin/sh` script;
- admission: µs per pod `review()` with this tree's webhook and, with --baseline REV, with REV's (a git
  worktree, in a subprocess), interleaved rounds: the delivery's share of a pod review.

    python bench/delivery.py [--repeat 30] [--baseline 27d4374]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))

REVIEW_PROBE = """
import json, sys, time, statistics
sys.path[:0] = [{support!r}, {tests!r}]  # the tests' helpers: tests/support/, or tests/ before the rooms
import trainhook.webhook.admission.review
assert trainhook.webhook.admission.review.__file__.startswith({tree!r}), trainhook.webhook.admission.review.__file__
from objects import pod_of_statefulset, review, statefulset
from trainhook.webhook.admission.mutate import mutate
from trainhook.webhook.admission.review import review as answer
from trainhook.webhook.settings import Settings
settings = Settings(gang_key=b"bench" * 8)
sts = mutate("StatefulSet", "CREATE", statefulset("ddp", 2), "default", settings).obj
bodies = [review(pod_of_statefulset(sts, i % 2)) for i in range(64)]
samples = []
for _ in range({rounds}):
    start = time.perf_counter()
    for i in range(200):
        answer(bodies[i % 64], settings)
    samples.append((time.perf_counter() - start) / 200 * 1e6)
print(json.dumps(samples))
"""


def timed(argv: list[str], env: dict | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def interleaved(a: list[str], b: list[str], repeat: int, env: dict | None = None) -> tuple[float, float]:
    first, second = [], []
    for i in range(repeat):
        for argv, into in ((a, first), (b, second)) if i % 2 else ((b, second), (a, first)):
            into.append(timed(argv, env))
    return statistics.median(first), statistics.median(second)


def review_samples(tree: Path, rounds: int) -> list[float]:
    code = REVIEW_PROBE.format(support=str(tree / "tests" / "support"), tests=str(tree / "tests"), tree=str(tree),
                               rounds=rounds)
    env = {**os.environ, "PYTHONPATH": str(tree / "build-path")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=tree / "build-path")
    if done.returncode != 0:
        raise RuntimeError(f"the review probe failed in {tree}:\n{done.stderr}")
    return json.loads(done.stdout)


def source_tree(tree: Path) -> Path:
    """A folder importable as the `trainhook` package layout (pyproject's package-dir) from `tree`."""
    path = tree / "build-path" / "trainhook"
    if not path.exists():
        path.parent.mkdir(parents=True)
        shutil.copytree(tree / "trainhook", path)
        for name, source in (("webhook", "webhook"), ("launcher", "launcher"), ("certs", "certs")):
            shutil.copytree(tree / source, path / name)
    return tree


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--baseline", help="a git revision to compare the pod review with (e.g. 27d4374)")
    args = parser.parse_args()
    from trainhook.launcher import deliver
    results: dict = {}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        installs = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            deliver.install(folder / "in-process")
            installs.append(time.perf_counter() - start)
        results["install_ms"] = statistics.median(installs) * 1e3
        results["zip_bytes"] = (folder / "in-process" / deliver.ZIP_NAME).stat().st_size
        launch = [sys.executable, "-m", "trainhook.launcher.cli"]
        env = {**os.environ, "TRAINHOOK_GANG_WAIT": "none"}
        env.pop("TRAINHOOK_FRAMEWORK", None)
        with_install, without = interleaved(launch + ["install", str(folder / "init")],
                                             launch + ["--help"], args.repeat, env)
        results["init_install_process_ms"], results["init_help_process_ms"] = with_install * 1e3, without * 1e3
        entry = folder / "in-process" / "bin" / deliver.SHIM_NAME
        results["entry"] = "static program" if deliver.is_program(entry.read_bytes()) else "/bin/sh script"
        results["entry_bytes"] = entry.stat().st_size
        python = shutil.which("python3") or sys.executable
        wrapped, bare = interleaved([str(entry), "run", "--", "true"], [python, "-I", "-c", "pass"], args.repeat)
        results["entry_run_true_ms"], results["python_start_ms"] = wrapped * 1e3, bare * 1e3
    if args.baseline:
        with tempfile.TemporaryDirectory() as scratch:
            base = Path(scratch) / "baseline"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), args.baseline],
                           check=True, capture_output=True)
            try:
                here, there = [], []
                copy = Path(scratch) / "here"
                shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".git", ".venv", "__pycache__"))
                for _ in range(6):
                    for tree, into in ((source_tree(copy), here), (source_tree(base), there)):
                        into.extend(review_samples(tree, 10))
                results["review_us"], results["baseline_review_us"] = (statistics.median(here),
                                                                       statistics.median(there))
                results["review_ratio"] = results["review_us"] / results["baseline_review_us"]
            finally:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)],
                               capture_output=True)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
