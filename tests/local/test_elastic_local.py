"""Elastic gangs and `trainhook local scale` with real processes (issue 18; root, network namespaces).

Two runs. One runs examples/pytorch/elastic.yaml unchanged but for a shorter training: real torchrun, c10d
rendezvous, DDP on gloo, scaled 2 -> 3 -> 2 while it trains; the training's own lines say the world size and the
step counter, which must continue across every rendezvous round. The other runs three small gangs at once (plain
Python under the delivered launcher, no torch, so it is quick): a fixed-size gang whose scale is refused as a
cluster refuses `kubectl scale`, an elastic gang scaled outside its range (refused), then within it (a member
joins the running attempt, then leaves on a scale-down without failing anything; a deleted pod is created again
and rejoins), and an elastic gang whose member really fails, which fails the gang.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import yaml
from helpers import local_summary, wait_for

from trainhook.local.scaling import plan

ROOT = Path(__file__).resolve().parents[2]
TRAIN = """import os, sys, time
index, job = int(os.environ["TRAINHOOK_INDEX"]), os.environ["TRAINHOOK_JOB_NAME"]
print(f"TRAIN {job} {index} attempt={os.environ.get('TRAINHOOK_ATTEMPT')}", flush=True)
if os.environ.get("FAIL_INDEX") == str(index):
    time.sleep(1)
    sys.exit(3)
while not os.path.exists("/shared/finish"):
    time.sleep(0.2)
"""


class Run:
    """`trainhook local` in the background, its output in a file, and `trainhook local scale` beside it."""

    def __init__(self, tmp_path: Path, docs: list, timeout: float):
        self.dir = tmp_path / "run"
        manifest = tmp_path / "manifest.yaml"
        manifest.write_text(yaml.safe_dump_all(docs, sort_keys=False))
        self.log = tmp_path / "out.log"
        self.timeout = timeout
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(["nice", sys.executable, "-m", "trainhook.local.cli", str(manifest),
                                          "--timeout", str(timeout), "--workdir", str(self.dir)],
                                         stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_line(self, pattern: str, timeout: float = 120.0, count: int = 1) -> None:
        def found():
            assert self.proc.poll() is None or len(re.findall(pattern, self.output(), re.M)) >= count, \
                self.output()[-5000:]
            return len(re.findall(pattern, self.output(), re.M)) >= count
        wait_for(f"{pattern!r} in the run's output", found, timeout=timeout)

    def scale(self, name: str, replicas: int) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "trainhook.cli", "local", "scale", str(self.dir),
                               f"statefulset/{name}", "--replicas", str(replicas)],
                              capture_output=True, text=True, timeout=120, cwd=ROOT)

    def delete(self, pod: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "trainhook.cli", "local", "delete", str(self.dir), f"pod/{pod}"],
                              capture_output=True, text=True, timeout=120, cwd=ROOT)

    def finish(self) -> str:
        try:
            self.proc.wait(timeout=self.timeout + 30)
        finally:
            if self.proc.poll() is None:
                self.proc.terminate()
                self.proc.wait(timeout=30)
        return self.output()

    def outcome(self) -> dict:
        return json.loads((self.dir / "outcome.json").read_text())


# --- the example: real torchrun elastic, scaled 2 -> 3 -> 2 ----------------------------------------------------

def example(steps: int) -> list:
    docs = [d for d in yaml.safe_load_all((ROOT / "examples" / "pytorch" / "elastic.yaml").read_text()) if d]
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    container = sts["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [e for e in container["env"] if e["name"] != "STEPS"] + [
        {"name": "STEPS", "value": str(steps)}, {"name": "STEP_SECONDS", "value": "0.4"}]
    return docs


STEP = re.compile(r"^\[elastic-0\] elastic: step (\d+) world (\d+) ", re.M)
ROUND = re.compile(r"^\[elastic-\d\] elastic: round \d+ world (\d+) resumes at step (\d+)$", re.M)


def test_the_elastic_example_trains_on_while_scaled_2_3_2_and_resumes_its_step_counter(tmp_path):
    run = Run(tmp_path, example(steps=90), timeout=400)
    try:
        run.wait_line(r"elastic: step 6 world 2 ")
        up = run.scale("elastic", 3)
        assert (up.returncode, up.stdout) == (0, "statefulset.apps/elastic scaled\n"), up.stderr
        run.wait_line(r"elastic: step \d+ world 3 ", count=4)
        down = run.scale("elastic", 2)
        assert (down.returncode, down.stdout) == (0, "statefulset.apps/elastic scaled\n"), down.stderr
        output = run.finish()
    finally:
        if run.proc.poll() is None:
            run.proc.terminate()
    assert run.proc.returncode == 0, output[-6000:]
    steps = [(int(s), int(w)) for s, w in STEP.findall(output)]
    worlds = [w for i, (_, w) in enumerate(steps) if i == 0 or steps[i - 1][1] != w]
    assert worlds == [2, 3, 2], steps
    counters = [s for s, _ in steps]
    assert counters[0] == 1 and counters[-1] == 90
    # Every round resumes from the checkpoint: the counter never goes back to 0, and never skips a step.
    rounds = [(int(w), int(s)) for w, s in ROUND.findall(output)]
    assert rounds[0] == (2, 0) and [w for w, _ in rounds[1:]] == [3, 2] and all(s > 0 for _, s in rounds[1:])
    resumed = {s for _, s in rounds[1:]}
    # No step skipped: each was printed, or saved and resumed from (a worker stopped between saving and printing).
    assert set(counters) | resumed >= set(range(1, 91)), counters
    for before, after in zip(counters, counters[1:]):  # the next step, or the one after a round's checkpoint
        assert after == before + 1 or after - 1 in resumed, counters
    assert "trainhook local: gang default/elastic succeeded (exit 0; attempt 1, 0 gang restarts)" in output
    rows = local_summary(output)
    assert rows["elastic-2"][-1] == "Deleted" and {rows[p][-1] for p in ("elastic-0", "elastic-1")} == {"Succeeded"}
    assert "is leaving the elastic gang" in output and "joined the running elastic gang" in output


# --- refusals and the lifecycle, with plain Python ------------------------------------------------------------

def gang(name: str, replicas: int, elastic: str | None = None, env: dict | None = None) -> list:
    annotations: dict[str, str] = {}
    if elastic:  # with a dns gang wait, whose elastic rule (the first min members only) the run checks
        annotations.update({"trainhook.dev/elastic": elastic, "trainhook.dev/gang-wait": "dns"})
    labels = {"trainhook.dev/framework": "pytorch"}
    container = {"name": "trainer", "image": "ignored",
                 "command": ["trainhook-launch", "run", "--", "python", "/code/train.py"],
                 "env": [{"name": "TRAINHOOK_FINISH_GRACE", "value": "1"}]
                 + [{"name": k, "value": v} for k, v in (env or {}).items()],
                 "volumeMounts": [{"name": "code", "mountPath": "/code"}, {"name": "shared", "mountPath": "/shared"}]}
    spec = {"terminationGracePeriodSeconds": 5, "containers": [container],
            "volumes": [{"name": "code", "configMap": {"name": "code"}},
                        {"name": "shared", "persistentVolumeClaim": {"claimName": "shared"}}]}
    return [{"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": {"trainhook.dev/job-name": name}},
             "spec": {"clusterIP": "None", "selector": {"trainhook.dev/job-name": name}}},
            {"apiVersion": "apps/v1", "kind": "StatefulSet",
             "metadata": {"name": name, "labels": labels, "annotations": annotations},
             "spec": {"serviceName": name, "replicas": replicas, "selector": {"matchLabels": {"app": name}},
                      "template": {"metadata": {"labels": {"app": name, **labels}}, "spec": spec}}}]


def test_scales_are_refused_as_a_cluster_refuses_them_and_an_elastic_gang_lives_through_them(tmp_path):
    docs = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "code"}, "data": {"train.py": TRAIN}},
            *gang("fixed", 2), *gang("el", 2, elastic="2:3"), *gang("boom", 2, elastic="1:2", env={"FAIL_INDEX": "1"})]
    run = Run(tmp_path, docs, timeout=150)
    try:
        run.wait_line(r"^\[(fixed|el)-\d\] TRAIN ", count=4)
        fixed = run.scale("fixed", 3)
        assert fixed.returncode == 1 and fixed.stdout == ""
        assert fixed.stderr == (
            "Error from server (Forbidden): admission webhook denied the request: StatefulSet default/fixed is a "
            "2-member pytorch gang (trainhook.dev/replicas='worker=2'); kubectl scale cannot change a running gang's "
            "size (spec.replicas 2 -> 3): change spec.replicas with kubectl apply (the gang restarts with the new "
            "shape) or make it elastic with trainhook.dev/elastic: min:max\n")
        for outside in (4, 1):
            refused = run.scale("el", outside)
            assert refused.returncode == 1 and "is an elastic pytorch gang of 2 to 3 members" in refused.stderr \
                and "scale within 2..3" in refused.stderr, refused.stderr
        missing = run.scale("nothere", 2)
        assert (missing.returncode, missing.stderr) == (
            1, 'Error from server (NotFound): statefulsets.apps "nothere" not found\n')
        assert run.scale("el", 3).returncode == 0
        run.wait_line(r"^\[el-2\] TRAIN el 2 attempt=1$")
        assert re.search(r"^\[el-0\] .*rank 2 \(worker-2 at el-2\.el\) joined the running elastic gang \(3 members "
                         r"now\): starting its training in attempt 1", run.output(), re.M)
        assert run.scale("el", 2).returncode == 0
        run.wait_line(r"^\[el-0\] .*rank 2 \(worker-2 at el-2\.el\) is leaving the elastic gang \(worker-2 got "
                      r"SIGTERM\); not a failure")
        # A pod deleted (or evicted) is created again by its controller and rejoins the running attempt.
        deleted = run.delete("el-1")
        assert (deleted.returncode, deleted.stdout) == (0, 'pod "el-1" deleted\n'), deleted.stderr
        run.wait_line(r"^\[el-1\] TRAIN el 1 attempt=1$", count=2)
        assert re.search(r"^\[el-0\] .*rank 1 \(worker-1 at el-1\.el\) is leaving the elastic gang", run.output(),
                         re.M)
        run.wait_line(r"^\[el-0\] .*rank 1 \(worker-1 at el-1\.el\) joined the running elastic gang")
        run.wait_line(r"^\[boom-0\] trainhook-launch coordinator: gang failed")
        (run.dir / "claims" / "default" / "shared" / "finish").write_text("")
        output = run.finish()
    finally:
        if run.proc.poll() is None:
            run.proc.terminate()
    gangs = run.outcome()["gangs"]
    assert gangs["default/fixed"]["phase"] == "Succeeded" and gangs["default/el"]["phase"] == "Succeeded"
    assert (gangs["default/boom"]["phase"], gangs["default/boom"]["code"]) == ("Failed", 3)
    assert gangs["default/boom"]["reason"] == "rank 1 (worker-1 at boom-1.boom) exited with 3"
    assert run.proc.returncode == 3, output[-4000:]
    rows = local_summary(output)
    assert rows["el-2"][-1] == "Deleted" and rows["el-1"][-1] == "Succeeded" and "fixed-2" not in rows
    assert output.count("TRAIN el 2 ") == 1  # the deleted member ran once and was not restarted
    # The scaled-up pod's gang wait waited for its own and rank 0's addresses (rank 0's for the first min members),
    # never for all max.
    assert re.search(r"^\[el-2/trainhook-gang-wait\] trainhook-launch wait: 2/2 of this pod's own and rank 0's "
                     r"addresses resolve$", output, re.M)
    assert re.search(r"^\[el-0/trainhook-gang-wait\] trainhook-launch wait: every member's address resolves "
                     r"\(2/2\)$", output, re.M)
    assert len(re.findall(r"^\[fixed-\d\] TRAIN ", output, re.M)) == 2  # the refusal touched no running pod


# --- the command's own errors (no run needed) -----------------------------------------------------------------

def test_the_scale_plan_creates_missing_ordinals_and_deletes_the_highest_first():
    assert plan({0: "a-0", 1: "a-1"}, 4) == ([2, 3], [])
    assert plan({0: "a-0", 1: "a-1", 2: "a-2", 3: "a-3"}, 2) == ([], ["a-3", "a-2"])
    assert plan({0: "a-0", 2: "a-2"}, 2) == ([1], ["a-2"])  # a missing ordinal is created again


def test_scale_says_what_is_wrong_without_a_run_or_with_a_target_it_cannot_scale(tmp_path):
    def scale(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "trainhook.cli", "local", "scale", *args], capture_output=True,
                              text=True, timeout=60, cwd=ROOT)

    none = scale(str(tmp_path), "statefulset/el", "--replicas", "3")
    assert (none.returncode, none.stderr) == (1, f"error: {tmp_path}: no `trainhook local` run is running with this "
                                                 f"run directory (start it with --workdir {tmp_path})\n")
    job = scale(str(tmp_path), "job/el", "--replicas", "3")
    assert job.returncode == 1 and job.stderr.startswith("error: 'job/el': give the target as statefulset/NAME")
