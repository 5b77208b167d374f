"""trainhook local, end to end: the real webhook, real network namespaces, real training (root)."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import yaml

from trainhook.local.network import list_run_namespaces
from helpers import local_failure, local_summary as summary

ROOT = Path(__file__).resolve().parents[2]
DDP = ROOT / "examples" / "pytorch" / "ddp.yaml"


def run_id(stderr: str) -> str:
    """The run id the CLI announces ("trainhook local: run abc123: 4 pod(s) on network ...")."""
    match = re.search(r"^trainhook local: run ([0-9a-f]{6}): ", stderr, re.M)
    assert match, stderr
    return match.group(1)


def assert_cleaned_up(stderr: str) -> None:
    """The run's own namespaces are gone (other runs may be going on beside this test)."""
    assert list_run_namespaces(run_id(stderr)) == []


def processes_of(run_dir: Path) -> list[str]:
    """Processes still alive whose environment names the run's directory: a container's, outliving it."""
    needle = str(run_dir).encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and needle in (entry / "environ").read_bytes():
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                found.append(f"{entry.name}: {command}")
        except OSError:
            continue
    return found


def local(*args: str, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainhook.local.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, **kwargs)




def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "manifest.yaml"
    path.write_text(text)
    return path


def test_the_ddp_example_trains_on_four_pods_once_and_cleans_up(tmp_path):
    """The StatefulSet's pods restart per restartPolicy Always, as on a kubelet: the delivered launcher is what
    keeps the finished training from running again (it parks)."""
    result = local(str(DDP), "--timeout", "240", "--workdir", str(tmp_path / "run"))
    assert result.returncode == 0, local_failure(result)
    rows = summary(result.stdout)
    assert sorted(rows) == ["ddp-0", "ddp-1", "ddp-2", "ddp-3"]
    assert [(rows[p][0], rows[p][1], rows[p][3]) for p in sorted(rows)] == [
        (str(i), "0", "Succeeded") for i in range(4)]
    for i in range(4):
        assert len(re.findall(rf"^\[ddp-{i}\] rank {i}/4 on ddp-{i}: training$", result.stdout, re.M)) == 1
    assert "[ddp-0] trainhook-launch run: gang succeeded" in result.stdout
    digests = set(re.findall(r"^\[ddp-\d\] final parameters digest (\w+) identical-across-ranks=True$",
                             result.stdout, re.M))
    assert len(digests) == 1
    assert len(re.findall(r"^\[ddp-\d\] final parameters digest", result.stdout, re.M)) == 4
    assert re.search(r"^\[ddp-0\] epoch 5 loss ", result.stdout, re.M)
    assert re.search(r"^\[ddp-2/trainhook-gang-wait\] ", result.stdout, re.M)
    assert "images are not pulled" in result.stderr
    assert "epoch 5 loss" in (tmp_path / "run/logs/ddp-0/trainer.log").read_text()
    assert_cleaned_up(result.stderr)


def test_a_gang_without_the_launcher_retrains_as_it_would_on_a_kubelet(tmp_path):
    """Opted out of the delivered launcher, a StatefulSet's finished training is restarted (restartPolicy
    Always), again and again: trainhook local is never kinder than a kubelet. The run ends on its timeout."""
    docs = [d for d in yaml.safe_load_all(DDP.read_text()) if d]
    for doc in docs:
        if doc["kind"] == "StatefulSet":
            doc["spec"]["replicas"] = 2
            doc["spec"]["template"]["metadata"].setdefault("annotations", {})["trainhook.dev/launcher"] = "none"
            doc["spec"]["template"]["spec"]["containers"][0]["env"] = [{"name": "EPOCHS", "value": "1"}]
    manifest = tmp_path / "retrains.yaml"
    manifest.write_text(yaml.safe_dump_all(docs))
    result = local(str(manifest), "--timeout", "45", "--workdir", str(tmp_path / "run"))
    assert result.returncode == 124, result.stdout[-3000:] + result.stderr[-3000:]
    # torchrun starts its workers in sessions of their own: the run still ends every process of a container.
    assert processes_of(tmp_path / "run") == []
    assert len(re.findall(r"^\[ddp-0\] rank 0/2 on ddp-0: training$", result.stdout, re.M)) >= 2
    assert re.search(r"^\[ddp-0\] trainhook local: container trainer exited with 0; restarting it in [0-9.]+s "
                     r"\(restartPolicy Always\) as a kubelet would", result.stdout, re.M)
    assert_cleaned_up(result.stderr)


ESCAPING = """
apiVersion: v1
kind: Service
metadata: {name: esc, labels: {trainhook.dev/job-name: esc}}
spec: {selector: {trainhook.dev/job-name: esc}}
---
apiVersion: batch/v1
kind: Job
metadata: {name: esc, labels: {trainhook.dev/framework: pytorch}}
spec:
  completionMode: Indexed
  completions: 1
  parallelism: 1
  template:
    metadata:
      labels: {trainhook.dev/framework: pytorch}
      annotations: {trainhook.dev/launcher: none}  # nothing of ours between the runner and the command
    spec:
      restartPolicy: Never
      containers:
      - name: trainer
        image: ignored
        command: ["sh", "-c", "setsid sleep 300 & echo left a process behind"]
"""


def test_a_container_ends_with_every_process_it_started_even_in_a_session_of_its_own(tmp_path):
    """As a runtime ends every process of a container with its main process: torchrun, for one, starts its
    workers in sessions of their own, and an orphan must not outlive the run."""
    run_dir = tmp_path / "run"
    result = local(str(write(tmp_path, ESCAPING)), "--timeout", "60", "--workdir", str(run_dir))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "left a process behind" in result.stdout
    assert processes_of(run_dir) == []


def test_a_training_container_sees_its_images_commands_and_the_delivered_launcher_not_ours(tmp_path):
    probe = ("command -v trainhook-launch || echo no trainhook-launch on PATH; ls /trainhook/bin; "
             "command -v python3; command -v torchrun")
    text = re.sub(r"args: \['if .*'\]", f"args: ['{probe}']", FAILING)
    text = text.replace("replicas: 3", "replicas: 1")
    result = local(str(write(tmp_path, text)), "--timeout", "60")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[gang-0] no trainhook-launch on PATH" in result.stdout
    assert "[gang-0] trainhook-launch" in result.stdout  # ls /trainhook/bin: the delivered one
    assert re.search(r"^\[gang-0\] /\S+/image-bin/python3$", result.stdout, re.M)
    assert re.search(r"^\[gang-0\] /\S+/image-bin/torchrun$", result.stdout, re.M)


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


def test_a_failing_pod_fails_the_gang_and_stops_the_others(tmp_path):
    """The delivered launcher ends the gang: rank 2's failure stops every member's training, and every pod parks
    (a StatefulSet's pods would rerun the training otherwise); the outcome names the rank and its code."""
    started = time.monotonic()
    result = local(str(write(tmp_path, FAILING)), "--timeout", "100")
    assert time.monotonic() - started < 60
    assert result.returncode == 3, result.stdout + result.stderr
    rows = summary(result.stdout)
    assert (rows["gang-2"][0], rows["gang-2"][1], rows["gang-2"][3]) == ("2", "3", "Parked")
    assert [rows[p][3] for p in ("gang-0", "gang-1")] == ["Parked"] * 2
    assert "[gang-2] rank 2 fails" in result.stdout
    assert ("run failed: gang default/gang failed: rank 2 (worker-2 at gang-2.gang) exited with 3 [pod gang-2] "
            "(exit 3)") in result.stdout
    assert_cleaned_up(result.stderr)


INDEXED = """
apiVersion: v1
kind: Service
metadata: {name: pairs, labels: {trainhook.dev/job-name: pairs}}
spec: {selector: {trainhook.dev/job-name: pairs}}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: code}
data:
  talk.py: |
    # Each line in one write: unbuffered, print() writes its pieces apart, and the launcher's own lines (stderr,
    # merged into the pod's log as a kubelet merges them) could land between them (seen once in CI).
    import os, socket, sys
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    if rank == 0:
        server = socket.create_server(("0.0.0.0", port))
        got = sorted(server.accept()[0].recv(64).decode() for _ in range(world - 1))
        sys.stdout.write(f"master {socket.gethostname()} heard {got} index {os.environ['JOB_COMPLETION_INDEX']}\\n")
    else:
        import time
        for _ in range(200):
            try:
                conn = socket.create_connection((addr, port), timeout=2)
                break
            except OSError:
                time.sleep(0.1)
        conn.sendall(f"{os.environ['POD_NAME'][:8]}@{os.environ['POD_IP']}".encode())
        sys.stdout.write(f"sent from {socket.gethostname()}\\n")
---
apiVersion: batch/v1
kind: Job
metadata: {name: pairs, labels: {trainhook.dev/framework: pytorch}}
spec:
  completionMode: Indexed
  completions: 3
  parallelism: 3
  template:
    metadata: {labels: {trainhook.dev/framework: pytorch}}
    spec:
      subdomain: pairs
      restartPolicy: Never
      containers:
      - name: t
        command: [python, /code/talk.py]
        env:
        - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
        - {name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}
        volumeMounts: [{name: code, mountPath: /code}]
      volumes: [{name: code, configMap: {name: code}}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: unrelated}
"""


def test_an_indexed_job_gang_talks_over_its_addresses(tmp_path):
    result = local(str(write(tmp_path, INDEXED)), "--timeout", "100")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Warning: ignored" in result.stderr and "Deployment/unrelated" in result.stderr
    rows = summary(result.stdout)
    assert len(rows) == 3 and all(re.fullmatch(r"pairs-[0-2]-[a-z0-9]{5}", name) for name in rows)
    assert sorted(row[0] for row in rows.values()) == ["0", "1", "2"]
    heard = re.search(r"master pairs-0 heard \['pairs-1-@(10\.244\.\d+\.\d+)', 'pairs-2-@(10\.244\.\d+\.\d+)'\] "
                      r"index 0", result.stdout)
    assert heard, result.stdout
    assert re.search(r"^\[pairs-1-\w{5}\] sent from pairs-1$", result.stdout, re.M)


def test_dry_run_prints_the_mutated_pods_without_running_anything():
    result = local(str(DDP), "--dry-run")
    assert result.returncode == 0, result.stderr
    pods = list(yaml.safe_load_all(result.stdout))
    assert [p["metadata"]["name"] for p in pods] == [f"ddp-{i}" for i in range(4)]
    env = {e["name"]: e.get("value") for e in pods[3]["spec"]["containers"][0]["env"]}
    assert env["TRAINHOOK_RANK"] == "3" and env["MASTER_ADDR"] == "ddp-0.ddp"
    assert "pod network" not in result.stderr  # no namespace was made
    assert "run files kept" not in result.stderr  # the temporary run directory is gone


def test_keep_dir_keeps_the_run_directory():
    result = local(str(DDP), "--dry-run", "--keep-dir")
    assert result.returncode == 0, result.stderr
    kept = Path(re.search(r"run files kept in (\S+)", result.stderr).group(1))
    try:
        assert list(yaml.safe_load_all((kept / "pods.yaml").read_text())) == list(yaml.safe_load_all(result.stdout))
        assert (kept / "webhook" / "webhook.log").is_file() and (kept / "webhook" / "certs" / "ca.crt").is_file()
    finally:
        shutil.rmtree(kept)


def test_invalid_yaml_is_reported_with_line_and_column(tmp_path):
    result = local(str(write(tmp_path, "apiVersion: v1\nkind: Pod\nmetadata: {name: a\n")))
    assert result.returncode == 1
    assert re.search(r"manifest.yaml:\d+:\d+: invalid YAML", result.stderr), result.stderr


def test_a_denied_object_stops_before_anything_runs(tmp_path):
    bare = ("apiVersion: v1\nkind: Pod\nmetadata: {name: p, labels: {trainhook.dev/framework: pytorch}}\n"
            "spec: {containers: [{name: c, command: [sh, -c, 'touch /tmp/should-not-run']}]}\n")
    result = local(str(write(tmp_path, bare)))
    assert result.returncode == 1
    assert "admission webhook denied the request" in result.stderr and "trainhook.dev/job-name" in result.stderr
    assert "pod network" not in result.stderr  # no namespace was made


def processes_with(tag: str) -> list[int]:
    """Pids whose environment holds `tag`."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if tag.encode() in environ.read_bytes():
                found.append(int(environ.parent.name))
        except OSError:
            pass
    return found


def test_sigterm_stops_the_run_and_removes_its_namespaces(tmp_path):
    tag = f"TAG_{uuid.uuid4().hex}"
    manifest = FAILING.replace("exit 3", "exec sleep 120").replace(
        "        image: ignored\n", f"        image: ignored\n        env: [{{name: {tag}, value: '1'}}]\n")
    assert tag in manifest
    proc = subprocess.Popen([sys.executable, "-m", "trainhook.local.cli", str(write(tmp_path, manifest)),
                             "--workdir", str(tmp_path / "run")], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("[gang-2] rank 2 fails"):
                break
        run = run_id("".join(seen))
        assert len(list_run_namespaces(run)) == 4  # the switch and three pods
        assert len(processes_with(tag)) >= 3
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, out
    assert "Terminated" in out
    assert list_run_namespaces(run) == []
    sandbox = (tmp_path / "run/pods/gang-0/sandbox.json").read_text()
    assert "sleep 120" in sandbox
    assert processes_with(tag) == []


def test_without_root_the_run_is_refused_with_the_reason():
    # A user namespace without a mapping makes this process uid 65534 (nobody) as far as the check can see.
    result = subprocess.run(["unshare", "--user", sys.executable, "-m", "trainhook.local.cli", str(DDP)],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 1
    assert "trainhook local needs root" in result.stderr and "no loopback-only mode" in result.stderr


def test_a_pod_that_cannot_be_built_leaves_no_namespace_behind(tmp_path):
    manifest = DDP.read_text().replace("name: ddp-script", "name: renamed-script", 1)
    result = local(str(write(tmp_path, manifest)))
    assert result.returncode == 1
    assert 'error: pod ddp-0: volume \'script\': configmap "ddp-script" not found' in result.stderr
    assert_cleaned_up(result.stderr)
