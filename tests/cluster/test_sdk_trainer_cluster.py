"""Trainer v2's SDK surface (`trainhook.TrainerClient`) and the v1 surface's condition calls against a real
Kubernetes API server with the real webhook: `train()` makes what `create_job` makes for the same function (the
workloads as stored after admission, and the pods the StatefulSet controller made through the webhook), and
get_job, list_jobs, wait_for_job_status, get_job_events, get_job_logs and delete_job read and remove it. No
kubelet: pods stay Pending; outcomes are recorded by the launcher's own writer (tests/support/launcher_outcomes.py).
The same function trained on the real node is tests/e2e/test_e2e_sdk_trainer.py."""

from __future__ import annotations

import json

import pytest

from launcher_outcomes import decided, record
from test_cli_cluster import wait_for
from trainhook import CustomTrainer, JobFailed, KubernetesBackendConfig, TrainerClient, TrainingClient

pytestmark = pytest.mark.cluster
IMAGE = "registry.example/torch:1"
# Set by the API server and its controllers, different for any two objects: not what the SDK decides.
VOLATILE_METADATA = ("uid", "resourceVersion", "creationTimestamp", "managedFields", "generation", "selfLink",
                     "ownerReferences", "generateName")
VOLATILE_LABELS = ("controller-revision-hash",)
# The webhook's stamp of which controller made a pod (an HMAC over its owner's uid, among others): differs with it.
VOLATILE_ANNOTATIONS = ("trainhook.dev/provenance",)


def train():
    import os
    print("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], flush=True)


def comparable(obj: dict, name: str) -> dict:
    """An object as the SDK decided it: the API server's bookkeeping and status dropped, the gang's name as NAME."""
    obj = json.loads(json.dumps(obj))
    obj.pop("status", None)
    meta = obj["metadata"]
    for key in VOLATILE_METADATA:
        meta.pop(key, None)
    for key in VOLATILE_LABELS:
        (meta.get("labels") or {}).pop(key, None)
    for key in VOLATILE_ANNOTATIONS:
        (meta.get("annotations") or {}).pop(key, None)
    return json.loads(json.dumps(obj).replace(name, "NAME"))


def test_train_makes_the_v1_gang_of_the_same_function(control_plane, k8s_namespace, mutating_webhook):
    config = KubernetesBackendConfig(namespace=k8s_namespace, config_file=str(control_plane.kubeconfig))
    resources = {"cpu": "100m", "memory": "64Mi"}
    with TrainerClient(config) as v2, TrainingClient(config_file=str(control_plane.kubeconfig),
                                                    namespace=k8s_namespace) as v1:
        runtime = v2.get_runtime("torch-distributed")
        runtime.trainer.image = IMAGE
        name = v2.train(runtime=runtime, trainer=CustomTrainer(func=train, num_nodes=2, resources_per_node=resources,
                                                               env={"EPOCHS": "2"}))
        assert len(name) == 12 and name[0].isalpha() and name.isalnum()  # Trainer's TrainJob names
        v1.create_job("v1gang", func=train, base_image=IMAGE, num_workers=2, resources_per_worker=resources,
                      env={"EPOCHS": "2"})
        gangs = {n: wait_for(lambda n=n: (lambda g: g if len(g.pods) == 2 else None)(v1.cluster.gang(n)),
                             what=f"{n}'s 2 pods") for n in (name, "v1gang")}
        made, expected = gangs[name], gangs["v1gang"]
        assert [comparable(w, name) for w in made.workloads] == [comparable(w, "v1gang") for w in expected.workloads]
        mine = sorted((comparable(p, name) for p in made.pods), key=lambda p: p["metadata"]["name"])
        theirs = sorted((comparable(p, "v1gang") for p in expected.pods), key=lambda p: p["metadata"]["name"])
        assert mine == theirs  # admitted by the real webhook: the same wiring, rank for rank
        trainer = next(c for c in made.pods[0]["spec"]["containers"] if c["name"] == "pytorch")
        assert {"name": "EPOCHS", "value": "2"} in trainer["env"]

        job = v2.get_job(name)
        assert (job.name, job.status, job.num_nodes, job.runtime.name, job.runtime.trainer.image) == (
            name, "Created", 2, "torch-distributed", IMAGE)
        # the count is torchrun's processes per node (PET_NPROC_PER_NODE, from the webhook), as Trainer reports it
        assert [(s.name, s.pod_name, s.status, s.device, s.device_count) for s in job.steps] == [
            ("node-0", f"{name}-0", "Pending", "cpu", "1"), ("node-1", f"{name}-1", "Pending", "cpu", "1")]
        assert sorted(j.name for j in v2.list_jobs()) == sorted([name, "v1gang"])
        assert [j.name for j in v2.list_jobs(runtime=v2.get_runtime("deepspeed-distributed"))] == []
        assert list(v2.get_job_logs(name)) == []  # node-0 has not started: no log yet, as Trainer skips it
        events = v2.get_job_events(name)
        assert any((e.involved_object_kind, e.involved_object_name, e.reason) == ("StatefulSet", name,
                                                                                   "SuccessfulCreate")
                   and f"Pod {name}-0" in e.message for e in events), events

        with pytest.raises(TimeoutError, match=f"TrainJob {name} to reach status"):
            v2.wait_for_job_status(name, timeout=1, polling_interval=1)
        assert v2.wait_for_job_status(name, status={"Created"}, timeout=5).status == "Created"
        with control_plane.api_client() as api:  # what rank 0's launcher records, with its own writer
            record(api, "StatefulSet", name, k8s_namespace, decided(name, size=2))
            assert v2.wait_for_job_status(name, timeout=10, polling_interval=1).status == "Complete"
            record(api, "StatefulSet", name, k8s_namespace, decided(name, size=2, rank=1, code=3))
        with pytest.raises(JobFailed, match="exited with 3"):  # a RuntimeError, as Trainer raises
            v2.wait_for_job_status(name, timeout=10, polling_interval=1)
        assert v2.wait_for_job_status(name, status={"Failed"}, timeout=10).status == "Failed"

        assert v2.delete_job(name) is None
        wait_for(lambda: not v1.cluster.gang(name).workloads, what="the gang's workloads to go")
        def gone() -> str | None:  # its pods go after its workloads (the garbage collector): then get_job says so
            try:
                v2.get_job(name)
            except RuntimeError as e:
                return str(e)
            return None
        assert wait_for(gone, what="get_job to say the TrainJob is gone").startswith(
            f"Failed to get TrainJob: {k8s_namespace}/{name}")
        with pytest.raises(RuntimeError, match=f"Failed to delete TrainJob: {k8s_namespace}/{name}"):
            v2.delete_job(name)
        v1.delete_job("v1gang")


def test_the_v1_condition_calls_follow_the_gang(control_plane, k8s_namespace, mutating_webhook):
    with TrainingClient(config_file=str(control_plane.kubeconfig), namespace=k8s_namespace) as client:
        assert client.get_job_conditions("cond") == [] and not client.is_job_created("cond")
        client.create_job("cond", func=train, num_workers=3, resources_per_worker={"cpu": "100m"})
        wait_for(lambda: len(client.get_job("cond").pods) == 3, what="3 pods")
        assert [(c.type, c.status) for c in client.get_job_conditions("cond", job_kind="PyTorchJob")] == [
            ("Created", "True")]
        assert client.is_job_created("cond") and not client.is_job_running("cond")
        assert not client.is_job_succeeded("cond") and not client.is_job_failed("cond")
        assert client.get_job_pod_names("cond") == ["cond-0", "cond-1", "cond-2"]
        assert client.get_job_pod_names("cond", is_master=True) == ["cond-0"]
        assert client.get_job_pod_names("cond", replica_type="worker", replica_index=2) == ["cond-2"]
        logs, events = client.get_job_logs("cond", job_kind="PyTorchJob", is_master=True, verbose=True)
        assert logs == {}  # Pending: no container has started
        assert any("cond-0" in line for line in events["StatefulSet cond"]), events

        looks = []
        with pytest.raises(TimeoutError, match="expected conditions"):
            client.wait_for_job_conditions("cond", wait_timeout=1, polling_interval=0.5, callback=looks.append)
        assert looks and looks[-1].name == "cond"
        assert client.wait_for_job_conditions("cond", expected_conditions={"Created"}).outcome == "Pending"
        with control_plane.api_client() as api:
            record(api, "StatefulSet", "cond", k8s_namespace, decided("cond", size=3))
        state = client.wait_for_job_conditions("cond", wait_timeout=10, polling_interval=0.5)
        assert [(c.type, c.status) for c in client.get_job_conditions(job=state)] == [
            ("Created", "True"), ("Running", "False"), ("Succeeded", "True")]
        assert client.is_job_succeeded("cond") and not client.is_job_running("cond")
        client.delete_job("cond")
