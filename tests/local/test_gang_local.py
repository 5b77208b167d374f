"""The gang lifecycle with real processes: `trainhook local` runs gangs whose training runs under
`trainhook-launch run`, restarting containers per restartPolicy as the kubelet does (root, network namespaces).

The training is tests/local/data/train.py (plain Python: a rendezvous at MASTER_ADDR:MASTER_PORT, then a sleep),
which prints `TRAIN START` / `TRAIN END` / `STOPPED` / `FAIL` lines with its rank, attempt and time, so the tests
count exactly how often each member ran. The policy variables the webhook will inject from the annotations
(TRAINHOOK_ON_FAILURE, TRAINHOOK_MAX_RESTARTS, TRAINHOOK_ACTIVE_DEADLINE_SECONDS) are set on the container here.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml
from helpers import local_summary as summary

from trainhook.webhook.notary.local import stored_events

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "local" / "data"
TRAIN = (DATA / "train.py").read_text()
RUN = ["trainhook-launch", "run", "--", "python", "/code/train.py"]
EVENT = re.compile(r"^\[(?P<pod>[\w-]+)\] "
                   r"(?P<what>TRAIN START|TRAIN END|STOPPED by \w+|FAIL with \w+|RENDEZVOUS[^\n]*?) "
                   r"rank=(?P<rank>\d+) attempt=(?P<attempt>\d+) t=(?P<t>[\d.]+)$", re.M)


def gang(name: str = "gang", kind: str = "StatefulSet", replicas: int = 3, env: dict | None = None,
         command: list[str] | None = None, restart_policy: str | None = None, namespace: str | None = None) -> list:
    """A Service, the training code's ConfigMap and a StatefulSet or Indexed Job running it under the launcher."""
    def meta(obj_name: str, **more) -> dict:
        return {"name": obj_name, **({"namespace": namespace} if namespace else {}), **more}
    labels = {"trainhook.dev/framework": "pytorch"}
    container = {"name": "trainer", "image": "ignored", "command": command or RUN,
                 "env": [{"name": k, "value": str(v)} for k, v in (env or {}).items()],
                 "volumeMounts": [{"name": "code", "mountPath": "/code"}]}
    spec = {"terminationGracePeriodSeconds": 5, "containers": [container],
            "volumes": [{"name": "code", "configMap": {"name": f"{name}-code"}}]}
    docs = [{"apiVersion": "v1", "kind": "Service", "metadata": meta(name, labels={"trainhook.dev/job-name": name}),
             "spec": {"selector": {"trainhook.dev/job-name": name}}},
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(f"{name}-code"), "data": {"train.py": TRAIN}}]
    if kind == "StatefulSet":
        if restart_policy:
            spec["restartPolicy"] = restart_policy
        docs.append({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta(name, labels=labels),
                     "spec": {"serviceName": name, "replicas": replicas, "selector": {"matchLabels": {"app": name}},
                              "template": {"metadata": {"labels": {"app": name, **labels}}, "spec": spec}}})
    else:
        spec.update(restartPolicy=restart_policy or "Never", subdomain=name)
        docs.append({"apiVersion": "batch/v1", "kind": "Job", "metadata": meta(name, labels=labels),
                     "spec": {"completionMode": "Indexed", "completions": replicas, "parallelism": replicas,
                              "backoffLimit": 0, "template": {"metadata": {"labels": labels}, "spec": spec}}})
    return docs


def local(tmp_path: Path, docs: list, timeout: float = 150, args: tuple = ()) -> subprocess.CompletedProcess:
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return subprocess.run(["nice", sys.executable, "-m", "trainhook.local.cli", str(manifest), "--timeout",
                           str(timeout - 30), "--workdir", str(tmp_path / "run"), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def events(stdout: str, what: str) -> list[tuple[str, int, int, float]]:
    """(pod, rank, attempt, time) of every training event `what` (TRAIN START, TRAIN END, STOPPED, FAIL)."""
    return [(m["pod"], int(m["rank"]), int(m["attempt"]), float(m["t"])) for m in EVENT.finditer(stdout)
            if m["what"].startswith(what)]


def runs(stdout: str) -> dict[int, list[int]]:
    """rank -> the attempts it started its training in."""
    started: dict[int, list[int]] = {}
    for _, rank, attempt, _ in events(stdout, "TRAIN START"):
        started.setdefault(rank, []).append(attempt)
    return started




def outcome(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "run" / "outcome.json").read_text())


def shown(result: subprocess.CompletedProcess) -> str:
    return result.stdout[-6000:] + result.stderr[-3000:]


def test_a_statefulset_gang_succeeds_once_and_parks_instead_of_rerunning(tmp_path):
    result = local(tmp_path, gang(env={"TRAIN_SECONDS": 2}))
    assert result.returncode == 0, shown(result)
    assert runs(result.stdout) == {0: [1], 1: [1], 2: [1]}  # every member trained once, in the same attempt
    assert len(events(result.stdout, "TRAIN END")) == 3
    rows = summary(result.stdout)
    assert {pod: (row[1], row[3]) for pod, row in rows.items()} == {f"gang-{i}": ("0", "Succeeded") for i in range(3)}
    for i in range(3):
        assert re.search(rf"^\[gang-{i}\] trainhook-launch run: parked: the gang is done and this pod's containers "
                         r"are restarted when they exit \(restartPolicy Always\)", result.stdout, re.M)
    # rank 0, the coordinator, recorded the outcome through the run's notary, as in a cluster
    assert re.search(r"^\[gang-0\] trainhook-launch run: parked: .*the notary recorded Succeeded on the gang's "
                     r"workloads and stops it", result.stdout, re.M)
    assert not re.search(r"^\[gang-[12]\] .*the notary recorded", result.stdout, re.M)  # only the coordinator
    stored = json.loads((tmp_path / "run" / "notary" / "workloads" / "default" / "StatefulSet" / "gang.json")
                        .read_text())
    assert stored["metadata"]["annotations"]["trainhook.dev/phase"] == "Succeeded"
    assert stored["metadata"]["labels"]["trainhook.dev/phase"] == "Succeeded" and stored["spec"]["replicas"] == 0
    assert [(e["reason"], e["involvedObject"]["name"]) for e in stored_events(tmp_path / "run")] == \
        [("GangSucceeded", "gang")]
    assert "restarting it" not in result.stdout
    assert "trainhook local: gang default/gang succeeded (exit 0; attempt 1, 0 gang restarts)" in result.stdout
    report = outcome(tmp_path)
    assert report["gangs"]["default/gang"]["phase"] == "Succeeded"
    assert [p["restarts"] for p in report["pods"]] == [0, 0, 0]


def test_an_indexed_job_gang_completes_as_a_job_and_stops_a_straggler(tmp_path):
    # Rank 2 would train for a minute: once rank 0 has succeeded it gets TRAINHOOK_FINISH_GRACE, then SIGTERM.
    result = local(tmp_path, gang(kind="Job", env={"TRAIN_SECONDS": 2, "TRAIN_SECONDS_RANK2": 60,
                                                   "TRAINHOOK_FINISH_GRACE": 2}))
    assert result.returncode == 0, shown(result)
    assert runs(result.stdout) == {0: [1], 1: [1], 2: [1]}
    assert sorted(rank for _, rank, _, _ in events(result.stdout, "TRAIN END")) == [0, 1]
    assert [rank for _, rank, _, _ in events(result.stdout, "STOPPED by SIGTERM")] == [2]
    rows = summary(result.stdout)
    assert len(rows) == 3 and all(row[3] == "Completed" for row in rows.values())  # every launcher exited 0
    assert "exiting 0: the gang is done (restartPolicy Never" in result.stdout
    assert "parked" not in result.stdout


def test_a_failing_worker_stops_the_whole_gang_within_10_seconds(tmp_path):
    result = local(tmp_path, gang(env={"TRAIN_SECONDS": 120, "TRAIN_FAIL": "2:3:1:1"}))
    assert result.returncode == 3, shown(result)
    (failure,) = events(result.stdout, "FAIL")
    assert failure[:3] == ("gang-2", 2, 1)
    stopped = events(result.stdout, "STOPPED by SIGTERM")
    assert sorted(rank for _, rank, _, _ in stopped) == [0, 1]
    assert max(t for *_, t in stopped) - failure[3] < 10
    assert runs(result.stdout) == {0: [1], 1: [1], 2: [1]}  # fail-gang: nobody ran again
    rows = summary(result.stdout)
    assert (rows["gang-2"][1], rows["gang-2"][3]) == ("3", "Parked")
    assert [rows[p][1] for p in ("gang-0", "gang-1")] == ["143", "143"]
    assert ("run failed: gang default/gang failed: rank 2 (worker-2 at gang-2.gang) exited with 3 [pod gang-2] "
            "(exit 3)") in result.stdout
    assert outcome(tmp_path)["gangs"]["default/gang"]["pod"] == "gang-2"


def test_restart_gang_restarts_everyone_once_after_a_sigkill_then_succeeds(tmp_path):
    env = {"TRAIN_SECONDS": 3, "TRAIN_FAIL": "1:kill:1:1", "TRAINHOOK_ON_FAILURE": "restart-gang",
           "TRAINHOOK_MAX_RESTARTS": 2}
    result = local(tmp_path, gang(env=env))
    assert result.returncode == 0, shown(result)
    assert runs(result.stdout) == {0: [1, 2], 1: [1, 2], 2: [1, 2]}  # together, once
    assert sorted((rank, attempt) for _, rank, attempt, _ in events(result.stdout, "TRAIN END")) == [
        (0, 2), (1, 2), (2, 2)]
    # The restart is a fresh rendezvous: attempt 2 meets on MASTER_PORT + 1.
    assert re.search(r"^\[gang-0\] RENDEZVOUS port=23457 heard=\['1@2', '2@2'\] rank=0 attempt=2 ", result.stdout,
                     re.M)
    assert ("rank 1 (worker-1 at gang-1.gang) exited with 137 (SIGKILL); rule restart-gang: signals (default) retries "
            "it: restarting the gang (restart 1 of 2)"
            in result.stdout)
    assert "gang default/gang succeeded (exit 0; attempt 2, 1 gang restart)" in result.stdout


def test_restart_gang_does_not_restart_on_exit_code_1(tmp_path):
    env = {"TRAIN_SECONDS": 60, "TRAIN_FAIL": "1:1:*", "TRAINHOOK_ON_FAILURE": "restart-gang",
           "TRAINHOOK_MAX_RESTARTS": 2}
    result = local(tmp_path, gang(kind="Job", env=env))
    assert result.returncode == 1, shown(result)
    assert runs(result.stdout) == {0: [1], 1: [1], 2: [1]}
    assert "exited with 1; rule fail-gang: 1-127 (default) makes it fatal" in result.stdout
    rows = summary(result.stdout)
    assert all(row[3] == "Error" for row in rows.values())  # Job pods exit with the gang's code


def test_the_active_deadline_ends_the_gang_with_124(tmp_path):
    result = local(tmp_path, gang(replicas=2, env={"TRAIN_SECONDS": 120, "TRAINHOOK_ACTIVE_DEADLINE_SECONDS": 3}))
    assert result.returncode == 124, shown(result)
    assert len(events(result.stdout, "STOPPED by SIGTERM")) == 2
    assert "DeadlineExceeded: the gang ran longer than trainhook.dev/active-deadline-seconds=3s" in result.stdout


class LauncherKiller(threading.Thread):
    """SIGKILLs a pod's launcher (its container's main process, so the container exits 137) once the launcher's
    status file (TRAINHOOK_LOCAL_STATUS, kept by `trainhook local`) matches `when`."""

    def __init__(self, tmp_path: Path, pod: str, when: dict, delay: float = 0.0):
        super().__init__(daemon=True)
        self.status = tmp_path / "run" / "pods" / pod / "status" / "trainer.json"
        self.when, self.delay, self.killed = when, delay, False

    def run(self) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                state = json.loads(self.status.read_text())
            except (OSError, ValueError):
                state = {}
            if state and all(state.get(k) == v for k, v in self.when.items()):
                time.sleep(self.delay)
                subprocess.run(["kill", "-9", str(state["pid"])], check=True)
                self.killed = True
                return
            time.sleep(0.1)


def test_a_restarted_container_does_not_rerun_training_it_finished(tmp_path):
    """Rank 1 finishes first; its launcher is then killed, so its container exits 137 and is restarted
    (restartPolicy Always). The new launcher asks the coordinator and does not run the training again."""
    killer = LauncherKiller(tmp_path, "gang-1", {"state": "waiting", "training_code": 0})
    killer.start()
    result = local(tmp_path, gang(env={"TRAIN_SECONDS": 1, "TRAIN_SECONDS_RANK0": 12}))
    killer.join(timeout=5)
    assert killer.killed, shown(result)
    assert result.returncode == 0, shown(result)
    assert runs(result.stdout) == {0: [1], 1: [1], 2: [1]}
    assert "[gang-1] trainhook local: container trainer exited with 137; restarting it in 0.5s (restartPolicy Always)" \
        in result.stdout
    assert "[gang-1] trainhook-launch run: this member already finished its part of attempt 1: not running it again" \
        in result.stdout
    assert summary(result.stdout)["gang-1"][1] == "0"
    assert [p["restarts"] for p in outcome(tmp_path)["pods"]] == [0, 1, 0]


def test_when_rank_0s_launcher_dies_the_members_stop_and_the_restarted_coordinator_restarts_the_gang(tmp_path):
    """Killing rank 0's launcher takes its training and the coordinator with it: the other members stop their
    training at once; rank 0's container restarts, its new coordinator hears from the members that attempt 1 was
    under way, counts that as rank 0 lost (129, retryable) and, under restart-gang, starts attempt 2."""
    killer = LauncherKiller(tmp_path, "gang-0", {"state": "running", "attempt": 1}, delay=1.0)
    killer.start()
    result = local(tmp_path, gang(env={"TRAIN_SECONDS": 6, "TRAINHOOK_ON_FAILURE": "restart-gang"}))
    killer.join(timeout=5)
    assert killer.killed, shown(result)
    assert result.returncode == 0, shown(result)
    assert runs(result.stdout) == {0: [1, 2], 1: [1, 2], 2: [1, 2]}
    assert sorted(rank for _, rank, _, _ in events(result.stdout, "STOPPED by SIGTERM")) == [1, 2]
    assert "stopping the training: the gang cannot go on without rank 0's launcher" in result.stdout
    assert ("rank 0 (worker-0 at gang-0.gang): its launcher restarted during attempt 1 (its container was restarted "
            "or its pod replaced); rule restart-gang: signals (default) retries it: restarting the gang (restart 1 "
            "of 3)") in result.stdout
    assert "gang default/gang succeeded (exit 0; attempt 2, 1 gang restart)" in result.stdout


def test_forged_completion_and_failure_messages_from_outside_the_gang_are_refused(tmp_path):
    """A bare Pod in the victim's namespace carrying the victim's labels and the look of rank 1 (its job name and a
    completion index: the webhook places it at victim-1.victim, of the gang's own shape), with a projected token of
    its own and the notary's URL and CA read from the victim's pod spec (RUN_DIR/pods.yaml: what `view` shows),
    asks the run's notary for the gang's key and to record success, and speaks the launchers' protocol to the
    coordinator with every key it can make: every attempt refused, and the gang ends with its own outcome."""
    forger = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "victim-intruder",
        "labels": {"trainhook.dev/framework": "pytorch", "trainhook.dev/job-name": "victim",
                   "trainhook.dev/role": "worker", "job-name": "victim"},
        "annotations": {"trainhook.dev/replicas": "worker=3", "trainhook.dev/launcher": "none",
                        "batch.kubernetes.io/job-completion-index": "1"}},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "forge", "image": "ignored", "command": ["python", "/code/forge.py"],
            "env": [{"name": "FORGE_TARGET", "value": "victim-0.victim.default.svc.cluster.local"},
                    {"name": "FORGE_NAMESPACE", "value": "default"}, {"name": "FORGE_JOB", "value": "victim"},
                    {"name": "FORGE_VIEW", "value": "/view/pods.yaml"}],
            "volumeMounts": [{"name": "code", "mountPath": "/code"},
                             {"name": "view", "mountPath": "/view/pods.yaml", "readOnly": True},
                             {"name": "own-identity", "mountPath": "/var/run/secrets/trainhook.dev/identity"}]}],
            "volumes": [{"name": "code", "configMap": {"name": "intruder-code"}},
                        {"name": "view", "hostPath": {"path": str(tmp_path / "run" / "pods.yaml")}},
                        # Anyone who can create a pod can mount a token of its ServiceAccount for any audience.
                        {"name": "own-identity", "projected": {"sources": [{"serviceAccountToken": {
                            "audience": "trainhook", "expirationSeconds": 3600, "path": "token"}}]}}]}}
    code = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "intruder-code"},
            "data": {"forge.py": (DATA / "forge.py").read_text()}}
    result = local(tmp_path, gang(name="victim", env={"TRAIN_SECONDS": 8}) + [code, forger])
    assert result.returncode == 0, shown(result)
    assert re.search(r"^\[victim-intruder\] read the notary's URL https://trainhook-notary:8444 and CA from pod victim-0",
                     result.stdout, re.M), shown(result)
    refused = re.findall(r"^\[victim-intruder\] REFUSED (.*)$", result.stdout, re.M)
    assert len(refused) == 5 and "ACCEPTED" not in result.stdout, shown(result)
    own_token, no_token, record, spec_key, random_key = refused
    assert "HTTP 403" in own_token and "only carries the label trainhook.dev/job-name=victim" in own_token
    assert "HTTP 401" in no_token
    assert "HTTP 403" in record and "only carries the label" in record
    assert all("bad signature" in line or "not signed" in line for line in (spec_key, random_key)), refused
    assert re.search(r"^\[victim-0\] trainhook-launch coordinator: refused a connection from 10\.244\.",
                     result.stdout, re.M)
    # The gang ran its own course: nobody was stopped or restarted, rank 0 finished and decided.
    assert runs(result.stdout) == {0: [1], 1: [1], 2: [1]}
    assert len(events(result.stdout, "TRAIN END")) == 3 and not events(result.stdout, "STOPPED")
    assert "gang default/victim succeeded (exit 0; attempt 1, 0 gang restarts)" in result.stdout
    stored = json.loads((tmp_path / "run" / "notary" / "workloads" / "default" / "StatefulSet" / "victim.json")
                        .read_text())
    assert stored["metadata"]["annotations"]["trainhook.dev/phase-reason"] == \
        "rank 0 (worker-0 at victim-0.victim) exited 0"
    assert summary(result.stdout)["victim-intruder"][1] == "0"  # the forger saw every attempt refused
    refusals = [json.loads(line) for line in (tmp_path / "run" / "webhook" / "webhook.log").read_text().splitlines()
                if '"notary refused"' in line]
    assert sorted(r["status"] for r in refusals) == [401, 403]  # each (who, reason) logged once
    assert any("pod default/victim-intruder only carries the label" in r["reason"] for r in refusals)


def test_a_torch_ddp_gang_under_the_launcher_restarts_with_a_fresh_rendezvous_and_trains(tmp_path):
    """Real torchrun + DDP (gloo, CPU) on two pods: the worker's torchrun is SIGKILLed once, two seconds into
    attempt 1; the gang restarts together (torchrun's MASTER_PORT moves by one) and then trains to the end."""
    docs = list(yaml.safe_load_all((ROOT / "examples" / "pytorch" / "ddp.yaml").read_text()))
    # `$$$$` is the shell's `$$` once Kubernetes has expanded `$(VAR)` references (`$$` escapes `$`). Attempt 1
    # trains far longer than 2 s (2 epochs take under 2 s on an idle machine), so the kill lands mid-training.
    kill_once = ('if [ "$TRAINHOOK_ATTEMPT" = 1 ]; then export EPOCHS=100000; '
                 'if [ "$RANK" = 1 ]; then (sleep 2; kill -9 $$$$) & fi; fi; exec torchrun /workspace/ddp.py')
    for doc in docs:
        if doc["kind"] == "StatefulSet":
            doc["spec"]["replicas"] = 2
            container = doc["spec"]["template"]["spec"]["containers"][0]
            container["command"] = ["trainhook-launch", "run", "--", "sh", "-c", kill_once]
            container["env"] = [{"name": "EPOCHS", "value": "2"},
                                {"name": "TRAINHOOK_ON_FAILURE", "value": "restart-gang"},
                                {"name": "TRAINHOOK_MAX_RESTARTS", "value": "1"}]
    result = local(tmp_path, docs, timeout=300)
    assert result.returncode == 0, shown(result)
    assert ("rank 1 (worker-1 at ddp-1.ddp) exited with 137 (SIGKILL); rule restart-gang: signals (default) retries it: "
            "restarting the gang (restart 1 of 1)") in result.stdout
    digests = set(re.findall(r"^\[ddp-[01]\] final parameters digest (\w+) identical-across-ranks=True$",
                             result.stdout, re.M))
    assert len(digests) == 1 and len(re.findall(r"final parameters digest", result.stdout)) == 2
    assert re.search(r"^\[ddp-0\] epoch 2 loss ", result.stdout, re.M)
    assert "gang default/ddp succeeded (exit 0; attempt 2, 1 gang restart)" in result.stdout
    assert {pod: row[3] for pod, row in summary(result.stdout).items()} == {"ddp-0": "Succeeded", "ddp-1": "Succeeded"}
