"""What `make demo` shows a first-time user (issue 25, item 7), through the real local runner (root).

The demo is `trainhook local examples/pytorch/ddp.yaml` with a temporary run directory: its output must not name a
directory that is gone at exit, its pod table must say `Succeeded` for a gang that succeeded (not the launcher's
`Parked` mechanism), its closing lines must say what happened and where to look, and it must carry no warning a
user cannot act on. A failed and a kept run must name the failing pod's log and the outcome where they really are.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from helpers import local_failure, local_summary as summary

ROOT = Path(__file__).resolve().parents[2]
DDP = ROOT / "examples" / "pytorch" / "ddp.yaml"
NOT_KEPT = "; not kept: --keep-dir or --workdir DIR keeps every container's log and outcome.json"


def local(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainhook.local.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def closing(stdout: str) -> list[str]:
    """The lines after the pod table: the verdict and where to look."""
    lines = stdout.rstrip("\n").splitlines()
    return lines[next(i for i, line in enumerate(lines) if line.startswith("run ")):]


def test_the_demo_says_succeeded_names_no_vanished_directory_and_says_where_the_logs_went():
    result = local(str(DDP), "--timeout", "240")
    assert result.returncode == 0, local_failure(result)
    rows = summary(result.stdout)
    assert {pod: (row[0], row[1], row[3]) for pod, row in rows.items()} == {
        f"ddp-{i}": (str(i), "0", "Succeeded") for i in range(4)}
    assert closing(result.stdout) == ["run succeeded (exit 0)",
                                      "logs: printed above, each line prefixed with its pod" + NOT_KEPT]
    # Every directory the run names exists after it (the temporary run directory is removed, so it is not named).
    named = set(re.findall(r"(/tmp/trainhook-local-\w+)", result.stdout + result.stderr))
    assert named == set(), named
    first = result.stderr.splitlines()[0]
    assert re.match(r"trainhook local: run [0-9a-f]{6}: pod network .*, run files in a temporary directory removed "
                    r"at exit \(--keep-dir keeps it\)$", first), first
    # No warning a user cannot act on: c10d's reverse lookup, torch's NumPy notice, or anything else.
    assert "hostname of the client socket" not in result.stdout
    assert "Failed to initialize NumPy" not in result.stdout
    assert not re.search(r"warning", result.stdout + result.stderr, re.I), [
        line for line in (result.stdout + result.stderr).splitlines() if "warn" in line.lower()]


def test_the_examples_numpy_filter_silences_torchs_warning_where_it_starts():
    """torch warns at import when NumPy is missing (the demo installs torch alone); the manifest's PYTHONWARNINGS,
    which torchrun and ddp.py inherit, silences exactly that warning. Shown with real torch, NumPy kept away."""
    (workload,) = [d for d in yaml.safe_load_all(DDP.read_text()) if d and d["kind"] == "StatefulSet"]
    env = {e["name"]: e["value"] for e in workload["spec"]["template"]["spec"]["containers"][0]["env"]}
    no_numpy = "import sys; sys.modules['numpy'] = None; import torch; print(torch.ones(2).sum().item())"
    base = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    loud = subprocess.run([sys.executable, "-c", no_numpy], capture_output=True, text=True, env=base, timeout=120)
    quiet = subprocess.run([sys.executable, "-c", no_numpy], capture_output=True, text=True, timeout=120,
                           env=dict(base, PYTHONWARNINGS=env["PYTHONWARNINGS"]))
    assert "Failed to initialize NumPy" in loud.stderr and loud.stdout == "2.0\n"
    assert quiet.stderr == "" and quiet.stdout == "2.0\n", quiet.stderr


FAILING = """
apiVersion: v1
kind: Service
metadata: {name: gang, labels: {trainhook.dev/job-name: gang}}
spec: {selector: {trainhook.dev/job-name: gang}}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: gang, labels: {trainhook.dev/framework: pytorch}}
spec:
  serviceName: gang
  replicas: 3
  selector: {matchLabels: {app: gang}}
  template:
    metadata: {labels: {app: gang, trainhook.dev/framework: pytorch}}
    spec:
      terminationGracePeriodSeconds: 5
      containers:
      - name: trainer
        image: ignored
        command: ["sh", "-c"]
        args: ['if [ "$TRAINHOOK_RANK" = 2 ]; then sleep 1; echo rank 2 fails; exit 3; fi; exec sleep 120']
"""


def test_a_failed_run_names_the_failing_pod_and_the_lines_to_read(tmp_path):
    manifest = tmp_path / "failing.yaml"
    manifest.write_text(FAILING)
    result = local(str(manifest), "--timeout", "100")
    assert result.returncode == 3, result.stdout + result.stderr
    assert summary(result.stdout)["gang-2"][3] == "Parked"  # a failed gang's pods are no success
    assert closing(result.stdout) == [
        "run failed: gang default/gang failed: rank 2 (worker-2 at gang-2.gang) exited with 3 [pod gang-2] (exit 3)",
        "logs: printed above, each line prefixed with its pod (the failing pod's lines start [gang-2])" + NOT_KEPT]
    assert "[gang-2] rank 2 fails" in result.stdout  # the lines it points at are there


def test_a_kept_run_names_the_failing_pods_log_and_the_outcome_where_they_are(tmp_path):
    manifest, run_dir = tmp_path / "failing.yaml", tmp_path / "run"
    manifest.write_text(FAILING)
    result = local(str(manifest), "--timeout", "100", "--workdir", str(run_dir))
    assert result.returncode == 3, result.stdout + result.stderr
    assert closing(result.stdout)[1] == (f"logs: {run_dir}/logs/POD/CONTAINER.log (the failing pod's: "
                                         f"{run_dir}/logs/gang-2/); outcome: {run_dir}/outcome.json")
    assert "rank 2 fails" in (run_dir / "logs" / "gang-2" / "trainer.log").read_text()
    assert json.loads((run_dir / "outcome.json").read_text())["exitCode"] == 3
    assert f"run files in {run_dir}" in result.stderr.splitlines()[0]
