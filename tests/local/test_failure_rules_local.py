"""Failure rules on gangs run by `trainhook local` (root, network namespaces: run under `flock -s
/tmp/trainhook-node.lock`): the annotations go through the real webhook into the launchers, as in a cluster.

- examples/pytorch/ddp.yaml on two pods, `restart-gang` with the default rules: in attempt 1 the worker process
  torchrun started in pod 1 is SIGKILLed mid-training (an OOM kill's signal). torchrun reports that as its own
  exit 1, and rank 0's worker, its peer gone, fails with gloo's "Connection reset by peer"; the launchers read
  torchrun's report (137) and the lost peer, the gang restarts once and trains to the end.
- tests/local/data/train.py on three pods with `trainhook.dev/failure-rules: fail-gang: 3; restart-gang: 1-127`:
  rank 2 exits 3 and the gang fails at once, with no restart, the outcome naming the rule.
"""

from __future__ import annotations

import re
import time

import yaml
from test_gang_local import ROOT, events, gang, local, runs, shown

from helpers import local_summary as summary

# The worker's entry point: ddp.py, except on attempt 1, where it trains without end and pod 1's worker SIGKILLs
# itself 2 s after its process group formed, so the kill lands mid-training.
KILL_ONCE = """import os, runpy, signal, sys, threading
import torch.distributed as dist
if os.environ.get("TRAINHOOK_ATTEMPT") == "1":
    os.environ["EPOCHS"] = "100000"
    if os.environ.get("RANK") == "1":
        init = dist.init_process_group
        def init_then_die(*args, **kwargs):
            init(*args, **kwargs)
            threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGKILL)).start()
        dist.init_process_group = init_then_die
sys.argv = ["/workspace/ddp.py"]
runpy.run_path("/workspace/ddp.py", run_name="__main__")
"""
RESTARTED = re.compile(r"exited with (?:137 \(SIGKILL\) \(torchrun: [^\n]*\); rule restart-gang: signals|"
                       r"1 \([^\n]*(?:reset|closed) by peer[^\n]*\); rule restart-gang: lost-peer) \(default\) "
                       r"retries it: restarting the gang \(restart 1 of 3\)")


def test_a_torchrun_worker_sigkilled_mid_training_restarts_the_gang_by_default_and_it_trains(tmp_path):
    docs = list(yaml.safe_load_all((ROOT / "examples" / "pytorch" / "ddp.yaml").read_text()))
    for doc in docs:
        if doc["kind"] == "ConfigMap":
            doc["data"]["kill_once.py"] = KILL_ONCE
        if doc["kind"] == "StatefulSet":
            doc["spec"]["replicas"] = 2
            doc["metadata"]["annotations"] = {"trainhook.dev/on-failure": "restart-gang"}  # no rules: the default
            container = doc["spec"]["template"]["spec"]["containers"][0]
            container["command"] = ["torchrun", "/workspace/kill_once.py"]
            container["env"] = [{"name": "EPOCHS", "value": "2"}]
    result = local(tmp_path, docs, timeout=300)
    assert result.returncode == 0, shown(result)
    # pod 1's launcher saw torchrun exit 1 and read why: its worker was killed by SIGKILL
    assert re.search(r"^\[ddp-1\] trainhook-launch run: the training exited with 1: torchrun: local rank 0's worker "
                     r"was killed by SIGKILL; reporting exit 137$", result.stdout, re.M), shown(result)
    # whichever member's failure reached the coordinator first (the killed one's, or its peer's lost connection),
    # a default rule restarted the gang, once
    assert len(RESTARTED.findall(result.stdout)) == 1, shown(result)
    assert re.search(r"^\[ddp-0\] epoch 2 loss ", result.stdout, re.M)
    assert len(set(re.findall(r"final parameters digest (\w+) identical-across-ranks=True", result.stdout))) == 1
    assert "gang default/ddp succeeded (exit 0; attempt 2, 1 gang restart)" in result.stdout


def test_an_exit_code_named_fatal_in_the_annotation_fails_the_gang_at_once(tmp_path):
    docs = gang(env={"TRAIN_SECONDS": 60, "TRAIN_FAIL": "2:3:1:1"})
    docs[-1]["metadata"]["annotations"] = {"trainhook.dev/on-failure": "restart-gang",
                                           "trainhook.dev/failure-rules": "fail-gang: 3; restart-gang: 1-127"}
    began = time.monotonic()
    result = local(tmp_path, docs)
    assert result.returncode == 3, shown(result)
    assert time.monotonic() - began < 60  # not the 60 s training: the gang was stopped
    assert runs(result.stdout) == {0: [1], 1: [1], 2: [1]}  # nobody ran a second attempt
    (failure,) = events(result.stdout, "FAIL")
    stopped = events(result.stdout, "STOPPED by SIGTERM")
    assert sorted(rank for _, rank, _, _ in stopped) == [0, 1] and max(t for *_, t in stopped) - failure[3] < 10
    assert "restarting the gang" not in result.stdout
    assert ("run failed: gang default/gang failed: rank 2 (worker-2 at gang-2.gang) exited with 3; rule fail-gang: 3 "
            "(trainhook.dev/failure-rules) makes it fatal [pod gang-2] (exit 3)") in result.stdout, shown(result)
    assert summary(result.stdout)["gang-2"][1] == "3"
