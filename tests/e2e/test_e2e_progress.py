"""A real torch gang on the node reports its progress (issue 33, docs/use/progress.md): 3 pods of the user's CPU torch
image (nothing of trainhook in it) train a DDP model over gloo, and rank 0's training appends a JSON line per step
to TRAINHOOK_PROGRESS_FILE, with no Kubernetes permission and no import of trainhook. Rank 0's delivered launcher
forwards it through the notary, which writes it on the StatefulSet: seen there while the gang trains and, at the end,
its last report, read back by `kubectl get -L`, `trainhook status` and the SDK's get_job. And the SDK's
get_job_logs(follow=True), called right after the manifests are applied (before any pod exists), returns every
rank's log, not the ranks whose pods happened to come first."""

from __future__ import annotations

import json
import subprocess
import threading

from e2e_gangs import NAMESPACE, delete_gang, statefulset, statefulset_gang
from e2e_helpers import REPO, wait_for

NAME = "e2e-progress"
STEPS = 12
TRAINING = f"""
import json, os, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(1, {STEPS} + 1):
    x = torch.randn(16, 4)
    loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"rank {{rank}} step {{step}} loss {{loss.item():.4f}}", flush=True)
    if rank == 0:
        with open(os.environ["TRAINHOOK_PROGRESS_FILE"], "a") as f:
            f.write(json.dumps({{"step": step, "total_steps": {STEPS}, "loss": loss.item()}}) + "\\n")
    time.sleep(1)
dist.destroy_process_group()
"""
TRAINHOOK = str(REPO / ".venv" / "bin" / "trainhook")


def test_a_torch_gang_reports_progress_that_is_read_back_from_its_workload(node, release):
    from trainhook import TrainingClient

    delete_gang(node, NAME)
    gang = statefulset_gang(NAME, node.images["torch"], ["python", "-c", TRAINING], 3)
    gang[1]["spec"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "TRAINHOOK_PROGRESS_INTERVAL", "value": "5"}]
    client = TrainingClient(config_file=node.node.kubeconfig, namespace=NAMESPACE)
    followed: dict = {}
    try:
        node.apply(NAMESPACE, gang)
        follower = threading.Thread(target=lambda: followed.update(client.get_job_logs(NAME, follow=True)))
        follower.start()  # right after the gang is created: no pod exists yet

        def reported_while_training():
            annotations = statefulset(node, NAME)["metadata"].get("annotations") or {}
            detail = annotations.get("trainhook.dev/progress-detail")
            assert "trainhook.dev/phase" not in annotations or detail, annotations
            return detail and "trainhook.dev/phase" not in annotations and json.loads(detail)
        early = wait_for(reported_while_training, 180, "a progress report while the gang trains", interval=0.5)
        assert 1 <= early["step"] < STEPS and early["totalSteps"] == STEPS, early

        def finished():
            annotations = statefulset(node, NAME)["metadata"].get("annotations") or {}
            assert annotations.get("trainhook.dev/phase") != "Failed", annotations
            return annotations.get("trainhook.dev/phase") == "Succeeded" and annotations
        annotations = wait_for(finished, 180, "the gang to succeed", interval=1)
        detail = json.loads(annotations["trainhook.dev/progress-detail"])
        assert (detail["step"], detail["totalSteps"], detail["percent"]) == (STEPS, STEPS, 100.0), detail
        assert set(detail["metrics"]) == {"loss"} and detail["time"].endswith("Z"), detail
        assert annotations["trainhook.dev/progress"].startswith(f"100% (step {STEPS}/{STEPS}), loss="), annotations

        shown = node.kubectl("get", "statefulset", NAME, "-n", NAMESPACE, "-L", "trainhook.dev/progress")
        assert shown.splitlines()[0].split()[-1] == "PROGRESS" and shown.splitlines()[1].split()[-1] == "100pct", \
            shown
        status = subprocess.run([TRAINHOOK, "status", NAME, "-n", NAMESPACE, "--kubeconfig", node.node.kubeconfig],
                                capture_output=True, text=True, timeout=60, env=node.env)
        assert status.returncode == 0, (status.stdout, status.stderr)
        assert f"progress: 100% (step {STEPS}/{STEPS}), loss=" in status.stdout, status.stdout
        assert client.get_job(NAME).progress["step"] == STEPS

        follower.join(120)
        assert not follower.is_alive(), "get_job_logs(follow=True) did not end with the gang"
        assert sorted(followed) == [f"{NAME}-{i}" for i in range(3)], sorted(followed)
        for i in range(3):
            assert f"rank {i} step {STEPS} loss" in followed[f"{NAME}-{i}"], followed[f"{NAME}-{i}"][-2000:]
    except BaseException:
        print(node.describe(NAMESPACE))
        raise
    finally:
        delete_gang(node, NAME, wait=False)
