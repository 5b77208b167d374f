"""A gang whose coordinator is gone too is still found and recorded (issue 31 item 4), by the notary's sweep
(webhook/notary/sweep.py), against the real v1.20 API server and Job controller.

The webhook (with its notary, `--notary-sweep-interval 1`) is the registered mutating webhook, as the chart's
Deployment is. v1.20's Job controller does not make Indexed Jobs' pods (the completion index came in 1.21: the
webhook refuses its index-less pods, test_control_plane_webhook.py), so the test makes each gang pod as a 1.21+ Job
controller would, as that controller's user (impersonated): the completion index, the Job's labels and its
controller reference; the webhook admits and stamps it as it does the real controller's. Everything after that is
the real Job controller's: it counts the pods, fails the Job at the first failure (`backoffLimit: 0`) and deletes
the pods still active (rank 0, its coordinator, among them), or completes it. No kubelet: the pods' ends are
written to their status as a kubelet writes them. No coordinator ever records: the sweep must.
"""

from __future__ import annotations

import copy

from kubernetes import client

from helpers import wait_for

SA = "trainer"
CONTROLLER = "system:serviceaccount:kube-system:job-controller"


def gang_job(name: str, completions: int, labeled: bool = True) -> dict:
    labels = {"trainhook.dev/framework": "pytorch"} if labeled else {"app": name}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": labels},
            "spec": {"completions": completions, "parallelism": completions, "completionMode": "Indexed",
                     "backoffLimit": 0,
                     "template": {"metadata": {"labels": dict(labels)},
                                  "spec": {"restartPolicy": "Never", "serviceAccountName": SA,
                                           "automountServiceAccountToken": False,
                                           "containers": [{"name": "trainer", "image": "example.com/train:1",
                                                           "command": ["python", "train.py"]}]}}}}


def make_pods_as_the_job_controller(control_plane, namespace: str, job) -> list[str]:
    """Each index's pod as a 1.21+ Job controller makes it, created as that controller's user."""
    names = []
    with control_plane.api_client() as api:
        api.set_default_header("Impersonate-User", CONTROLLER)
        core = client.CoreV1Api(api)
        for index in range(job.spec.completions):
            template = api.sanitize_for_serialization(job.spec.template)
            meta = copy.deepcopy(template["metadata"])
            meta.update(generateName=f"{job.metadata.name}-{index}-", ownerReferences=[{
                "apiVersion": "batch/v1", "kind": "Job", "name": job.metadata.name, "uid": job.metadata.uid,
                "controller": True, "blockOwnerDeletion": True}])
            meta.setdefault("annotations", {})["batch.kubernetes.io/job-completion-index"] = str(index)
            spec = {**template["spec"], "hostname": f"{job.metadata.name}-{index}"}
            names.append(core.create_namespaced_pod(namespace, {"apiVersion": "v1", "kind": "Pod",
                                                                "metadata": meta, "spec": spec}).metadata.name)
    return names


def end(core, namespace: str, pod: str, code: int) -> None:
    """What the kubelet writes when the pod's only container exits `code` (restartPolicy Never)."""
    core.patch_namespaced_pod_status(pod, namespace, {"status": {
        "phase": "Succeeded" if code == 0 else "Failed",
        "containerStatuses": [{"name": "trainer", "ready": False, "restartCount": 0, "image": "example.com/train:1",
                               "imageID": "", "state": {"terminated": {"exitCode": code,
                                                                        "finishedAt": "2026-11-27T10:00:00Z"}}}]}})


def notary_events(core, namespace: str, name: str) -> list:
    return [e for e in core.list_namespaced_event(namespace).items
            if e.involved_object.name == name and e.source and e.source.component == "trainhook-notary"]


def test_finished_gang_jobs_nobody_recorded_are_recorded_and_told_and_a_plain_job_is_not_touched(
        sweeping_notary, control_plane, k8s_namespace):
    ns = k8s_namespace
    with control_plane.api_client() as api:
        core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
        core.create_namespaced_service_account(ns, {"metadata": {"name": SA}})
        jobs = {name: batch.create_namespaced_job(ns, gang_job(name, 3)) for name in ("lost-fail", "lost-ok")}
        pods = {name: make_pods_as_the_job_controller(control_plane, ns, job) for name, job in jobs.items()}
        stored = core.read_namespaced_pod(pods["lost-fail"][1], ns)
        assert "trainhook.dev/provenance" in stored.metadata.annotations  # admitted as the controller's pod
        batch.create_namespaced_job(ns, gang_job("plain", 1, labeled=False))
        plain_pod = wait_for("the plain Job's pod (made by the real Job controller)", lambda: [
            p.metadata.name for p in core.list_namespaced_pod(ns, label_selector="app=plain").items], timeout=60)[0]

        end(core, ns, pods["lost-fail"][1], 3)  # rank 1 fails; the Job controller fails the Job and deletes the rest
        end(core, ns, plain_pod, 3)
        for pod in pods["lost-ok"]:
            end(core, ns, pod, 0)

        def recorded(name: str):
            labels = batch.read_namespaced_job(name, ns).metadata.labels or {}
            return labels.get("trainhook.dev/phase")
        assert wait_for("lost-fail recorded by the sweep", lambda: recorded("lost-fail"), timeout=90) == "Failed"
        assert wait_for("lost-ok recorded by the sweep", lambda: recorded("lost-ok"), timeout=90) == "Succeeded"
        remaining = {p.metadata.name for p in core.list_namespaced_pod(ns, label_selector="job-name=lost-fail").items}
        assert pods["lost-fail"][0] not in remaining  # rank 0 (its coordinator) was gone: the Job controller's doing

        failed = batch.read_namespaced_job("lost-fail", ns)
        assert any(c.type == "Failed" and c.status == "True" for c in failed.status.conditions)
        notes = failed.metadata.annotations
        assert (notes["trainhook.dev/exit-code"], notes["trainhook.dev/phase-rank"],
                notes["trainhook.dev/phase-pod"]) == ("3", "1", pods["lost-fail"][1])
        assert "coordinator" in notes["trainhook.dev/phase-reason"]
        told = wait_for("the GangFailed Event", lambda: notary_events(core, ns, "lost-fail"), timeout=30)
        assert [(e.type, e.reason) for e in told] == [("Warning", "GangFailed")]
        assert "rank 1" in told[0].message and "exited 3" in told[0].message
        assert [e.reason for e in wait_for("the GangSucceeded Event",
                                           lambda: notary_events(core, ns, "lost-ok"), timeout=30)] == ["GangSucceeded"]

        untouched = batch.read_namespaced_job("plain", ns)
        assert any(c.type == "Failed" and c.status == "True" for c in untouched.status.conditions)
        assert not any(k.startswith("trainhook.dev/") for k in {**(untouched.metadata.annotations or {}),
                                                                **(untouched.metadata.labels or {})})
        assert notary_events(core, ns, "plain") == []
