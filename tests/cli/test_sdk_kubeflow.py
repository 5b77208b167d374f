"""Kubeflow training SDK's `create_job` parameters on `trainhook.TrainingClient` (v1.7-v1.9 names): each is mapped
the way Kubeflow's SDK builds its pod template, or refused naming trainhook's counterpart. The manifests are
checked as the API server would see them (kubernetes-validate) and, through the webhook's own code (`trainhook
explain`), as the pods the StatefulSet controller would create. The same call against a real API server and the
real webhook is in tests/cluster/test_sdk_cluster.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubernetes.client import V1EnvVar, V1EnvVarSource, V1ObjectFieldSelector, V1ObjectMeta, \
    V1ResourceRequirements

from rendered import validate_objects
from trainhook.gang import keys
from trainhook.render.explain import explain_text
from trainhook.render import to_yaml
from trainhook.sdk import TrainingClient, job_manifests
from trainhook.sdk.kubeflow import JOB_KINDS

ROOT = Path(__file__).resolve().parents[2]


def train_func(parameters=None):
    """Shipped to every pod (never run here)."""
    import os
    print("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], parameters)


def offline_client() -> TrainingClient:
    return TrainingClient(config_file="/nonexistent/kubeconfig")  # dry_run never connects


def pods_of(objects: list[dict]) -> list[dict]:
    """The pods the controllers would create, as the webhook mutates them (its own code, offline)."""
    return [item.pod for item in explain_text(to_yaml(objects), "sdk").pods]


def env_of(pod: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", "(valueFrom)") for e in pod["spec"]["containers"][0].get("env") or []}


def test_the_seed_call_with_kubeflows_job_kind_makes_100_gpu_pods():
    objects = offline_client().create_job(name="seed", func=train_func, num_workers=100,
                                          resources_per_worker={"gpu": "2"}, job_kind="PyTorchJob", dry_run=True)
    validate_objects(objects)
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [("Service", "seed"), ("StatefulSet", "seed")]
    sts = objects[1]
    assert sts["spec"]["replicas"] == 100 and sts["metadata"]["labels"][keys.FRAMEWORK] == "pytorch"
    container = sts["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"] == {"requests": {keys.GPU_RESOURCE: "2"}, "limits": {keys.GPU_RESOURCE: "2"}}
    assert container["command"][2].splitlines()[-1] == 'exec torchrun "$program_path/ephemeral_script.py"'
    pods = pods_of(objects)
    assert len(pods) == 100
    for ordinal in (0, 57, 99):
        env = env_of(pods[ordinal])
        # torchrun starts one process per GPU (nproc auto); Kubeflow's WORLD_SIZE counts pods unless
        # num_procs_per_worker is a number, and torchrun hands each process its own WORLD_SIZE=200
        assert (env["RANK"], env["WORLD_SIZE"], env["PET_NNODES"], env["PET_NPROC_PER_NODE"]) == (
            str(ordinal), "100", "100", "2")
        assert {"key": keys.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"} in \
            pods[ordinal]["spec"]["tolerations"]


def test_every_kubeflow_create_job_parameter_with_a_meaning_is_mapped():
    objects = offline_client().create_job(
        name="mnist", namespace="team-a", job_kind="PyTorchJob", base_image="registry.example/train:1",
        train_func=train_func, parameters={"lr": 0.1}, num_workers=3, num_procs_per_worker=2,
        resources_per_worker={"CPU": "4", "memory": "8Gi", "gpu": 2}, packages_to_install=["torchvision"],
        pip_index_url="https://pypi.example/simple",
        env_vars=[V1EnvVar(name="NCCL_DEBUG", value="INFO"),
                  V1EnvVar(name="NODE", value_from=V1EnvVarSource(
                      field_ref=V1ObjectFieldSelector(field_path="spec.nodeName")))],
        dry_run=True)
    validate_objects(objects)
    sts = objects[1]
    assert (sts["metadata"]["namespace"], sts["spec"]["replicas"]) == ("team-a", 3)
    assert sts["metadata"]["annotations"][keys.NPROC_PER_NODE] == "2"
    container = sts["spec"]["template"]["spec"]["containers"][0]
    amounts = {"cpu": "4", "memory": "8Gi", keys.GPU_RESOURCE: 2}  # lower-cased, gpu mapped: Kubeflow's rule
    assert container["resources"] == {"requests": amounts, "limits": amounts}
    assert container["image"] == "registry.example/train:1"
    assert container["env"] == [{"name": "NCCL_DEBUG", "value": "INFO"},
                                {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
    script = container["command"][2]
    assert "--index-url https://pypi.example/simple torchvision" in script
    assert 'train_func(json.loads(\'{"lr": 0.1}\'))' in script
    env = env_of(pods_of(objects)[2])
    assert (env["RANK"], env["WORLD_SIZE"], env["PET_NPROC_PER_NODE"]) == ("2", "6", "2")  # 3 pods x 2 processes
    assert env["NCCL_DEBUG"] == "INFO" and env["NODE"] == "(valueFrom)"


def test_a_clients_job_kind_and_tfjobs_chief_and_ps_replicas():
    client = TrainingClient(config_file="/nonexistent/kubeconfig", job_kind="TFJob")
    objects = client.create_job("ps", train_func=train_func, num_workers=2, num_chief_replicas=1,
                                num_ps_replicas=1, env_vars={"EPOCHS": 3}, dry_run=True)
    validate_objects(objects)
    assert [o["metadata"]["name"] for o in objects] == ["ps", "ps-chief", "ps-ps", "ps-worker"]
    assert objects[1]["metadata"]["labels"][keys.FRAMEWORK] == "tensorflow"
    assert objects[1]["spec"]["template"]["spec"]["containers"][0]["env"] == [{"name": "EPOCHS", "value": "3"}]
    assert [env_of(p)["TRAINHOOK_RANK"] for p in pods_of(objects)] == ["0", "1", "2", "3"]  # chief first
    # a call's own framework (or job_kind) wins over the client's
    assert client.create_job("pt", command=["true"], framework="pytorch", dry_run=True)[1]["metadata"]["labels"][
        keys.FRAMEWORK] == "pytorch"


@pytest.mark.parametrize("job_kind", sorted(JOB_KINDS))
def test_every_kubeflow_job_kind_is_a_framework(job_kind):
    objects = job_manifests("g", command=["python", "train.py"], job_kind=job_kind, num_workers=2)
    assert {o["metadata"]["labels"][keys.FRAMEWORK] for o in objects[1:]} == {JOB_KINDS[job_kind]}


def test_a_v1_resource_requirements_and_the_images_own_entrypoint_given_as_command():
    resources = V1ResourceRequirements(limits={"gpu": "1", "memory": "2Gi"}, requests={"cpu": "500m"})
    objects = job_manifests("img", base_image="registry.example/trainer:2", num_workers=2,
                            resources_per_worker=resources, command=["python", "/app/train.py"])
    validate_objects(objects)
    container = objects[1]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["python", "/app/train.py"]
    assert container["resources"] == {"limits": {keys.GPU_RESOURCE: "1", "memory": "2Gi"},
                                      "requests": {"cpu": "500m"}}


class KubeflowOrgV1PyTorchJob:
    """What the Kubeflow SDK's generated model looks like to a caller (the same OpenAPI generator as
    kubernetes.client): attributes plus `openapi_types` and `attribute_map`."""

    openapi_types = {"api_version": "str", "kind": "str", "metadata": "V1ObjectMeta", "spec": "object"}
    attribute_map = {"api_version": "apiVersion", "kind": "kind", "metadata": "metadata", "spec": "spec"}

    def __init__(self, api_version, kind, metadata, spec):
        self.api_version, self.kind, self.metadata, self.spec = api_version, kind, metadata, spec


def test_a_kubeflow_job_object_is_converted_as_trainhook_convert_does():
    document = yaml.safe_load((ROOT / "examples" / "kubeflow" / "pytorchjob.yaml").read_text())
    job = KubeflowOrgV1PyTorchJob("kubeflow.org/v1", "PyTorchJob", V1ObjectMeta(name="pytorch-mnist"),
                                  document["spec"])
    with pytest.warns(UserWarning):  # cleanPodPolicy has no counterpart: said, not dropped silently
        objects = offline_client().create_job(job, namespace="team-b", dry_run=True)  # Kubeflow's first argument
    validate_objects(objects)
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        ("Service", "pytorch-mnist"), ("StatefulSet", "pytorch-mnist-master"),
        ("StatefulSet", "pytorch-mnist-worker")]
    assert {o["metadata"].get("namespace") for o in objects} == {"team-b"}
    with pytest.warns(UserWarning):
        assert offline_client().create_job(job=document, dry_run=True)[1]["metadata"]["namespace"] == "team-a"


@pytest.mark.parametrize("arguments, message", [
    (dict(job_kind="MXJob"), "job_kind='MXJob': trainhook runs JAXJob, MPIJob, PaddleJob, PyTorchJob, TFJob, "
                             "XGBoostJob (or give trainhook's framework="),
    (dict(job_kind="TFJob", framework="pytorch"), "job_kind='TFJob' is framework='tensorflow', but "
                                                  "framework='pytorch' was given too: keep one"),
    (dict(train_func=train_func), "train_func= (Kubeflow's name) and func= (trainhook's) mean the same: give one"),
    (dict(parameters={}, func_args={}), "parameters= (Kubeflow's name) and func_args= (trainhook's)"),
    (dict(num_worker_replicas=2, num_workers=2), "num_worker_replicas= (Kubeflow's name) and num_workers="),
    (dict(num_chief_replicas=1), "num_chief_replicas and num_ps_replicas are TFJob's roles; a pytorch gang has "
                                 "master, worker (give job_kind='TFJob' for chief and ps)"),
    (dict(job_kind="TFJob", num_chief_replicas=2), "num_chief_replicas=2: a TFJob has at most one chief"),
    (dict(job_kind="TFJob", num_procs_per_worker=2), "num_procs_per_worker is PyTorchJob's (torchrun's "
                                                     "--nproc-per-node); a tensorflow gang runs one process per pod"),
    (dict(resources_per_worker={"gpu": "1.5"}), "resources_per_worker: gpu='1.5': give a whole number of GPUs"),
    (dict(resources_per_worker={"gpu": 1, "nvidia.com/gpu": 1}), "nvidia.com/gpu given twice"),
    (dict(env={"A": "1"}, env_vars={"A": "1"}), "env_vars= (Kubeflow's name) and env= (trainhook's)"),
    (dict(env_vars=["A=1"]), "env_vars must be a dict {NAME: value} or a list of V1EnvVar"),
    (dict(job=[{"kind": "Service"}]), "with job=, only namespace= may be given (the job says the rest); drop func, "
                                      "name"),
    (dict(func=None, job=None), "give func= (a function to run on every pod), command= (a container command), or "
                                "base_image="),
    (dict(func=None, base_image="registry.example/t:1"),
     "base_image='registry.example/t:1' alone would run the image's ENTRYPOINT, which trainhook's webhook cannot "
     "read at admission"),
])
def test_kubeflow_parameters_without_a_meaning_here_are_refused_by_name(arguments, message):
    given = {"name": "g", "func": train_func, **arguments}
    with pytest.raises(ValueError) as raised:
        offline_client().create_job(dry_run=True, **given)
    assert message in str(raised.value)


def test_an_unknown_job_kind_is_refused_when_the_client_is_made():
    with pytest.raises(ValueError, match="job_kind='MXJob': trainhook runs JAXJob"):
        TrainingClient(job_kind="MXJob")


# --- Kubeflow v1's condition calls and pod selection (trainhook/sdk/conditions.py) ---------------------------

def gang_pods(**options) -> list[dict]:
    """The pods of a gang as the webhook admits them (explain: its own code), in rank order."""
    return pods_of(job_manifests("g", command=["python", "t.py"], **options))


@pytest.mark.parametrize("options, selection, names", [
    (dict(num_workers=3), dict(), ["g-0", "g-1", "g-2"]),
    (dict(num_workers=3), dict(is_master=True), ["g-0"]),  # N equal pods: rank 0 is Kubeflow's master
    (dict(num_workers=3), dict(replica_type="Master"), ["g-0"]),
    (dict(num_workers=3), dict(replica_type="worker", replica_index=2), ["g-2"]),
    (dict(framework="tensorflow", num_workers=2, num_chief_replicas=1, num_ps_replicas=1), dict(is_master=True),
     ["g-chief-0"]),
    (dict(framework="tensorflow", num_workers=2, num_chief_replicas=1, num_ps_replicas=1), dict(replica_type="PS"),
     ["g-ps-0"]),
    (dict(framework="tensorflow", num_workers=2, num_chief_replicas=1, num_ps_replicas=1),
     dict(replica_type="worker", replica_index=1), ["g-worker-1"]),
    (dict(framework="mpi", num_workers=2), dict(is_master=True), ["g-launcher-0"]),
])
def test_pods_are_selected_as_kubeflow_selects_them(options, selection, names):
    from trainhook.sdk.conditions import select_pods

    assert [p["metadata"]["name"] for p in select_pods(gang_pods(**options), **selection)] == names


def test_an_unknown_replica_type_is_refused_naming_the_types():
    from trainhook.sdk.conditions import select_pods

    with pytest.raises(ValueError, match="replica_type='Evaluatorz': one of chief, evaluator, launcher, master"):
        select_pods(gang_pods(num_workers=1), replica_type="Evaluatorz")


def with_status(pod: dict, phase: str, restarts: int = 0, waiting: str = "") -> dict:
    state = {"waiting": {"reason": waiting}} if waiting else {"running": {}}
    return {**pod, "status": {"phase": phase, "containerStatuses": [
        {"name": pod["spec"]["containers"][0]["name"], "restartCount": restarts, "state": state}]}}


def statefulset(outcome=None) -> dict:
    workload = job_manifests("g", command=["python", "t.py"], num_workers=2)[1]
    if outcome is not None:
        workload["metadata"]["annotations"] = outcome.annotations()
    return workload


def test_a_gangs_conditions_are_those_a_kubeflow_controller_writes():
    from launcher_outcomes import decided
    from trainhook.cluster.status import gang_state
    from trainhook.sdk.conditions import job_conditions

    def conditions(pods, outcome=None):
        return [(c.type, c.status) for c in job_conditions(gang_state("g", "ns", [statefulset(outcome)], pods))]

    first, second = gang_pods(num_workers=2)
    assert conditions([with_status(first, "Pending"), with_status(second, "Running")]) == [("Created", "True")]
    assert conditions([with_status(first, "Running"), with_status(second, "Running")]) == [
        ("Created", "True"), ("Running", "True")]
    assert conditions([with_status(first, "Running"), with_status(second, "Running", 2, "CrashLoopBackOff")]) == [
        ("Created", "True"), ("Running", "True")]  # every pod running: Running, as Kubeflow's controller says
    assert conditions([with_status(first, "Pending"), with_status(second, "Running", 2)]) == [
        ("Created", "True"), ("Restarting", "True")]
    succeeded = decided("g", size=2)
    assert conditions([], succeeded) == [("Created", "True"), ("Running", "False"), ("Succeeded", "True")]
    assert conditions([], decided("g", size=2, rank=1, code=3)) == [
        ("Created", "True"), ("Running", "False"), ("Failed", "True")]
    last = job_conditions(gang_state("g", "ns", [statefulset(succeeded)], []))[-1]
    assert last.last_transition_time.isoformat().replace("+00:00", "Z") == succeeded.time
    assert job_conditions(gang_state("g", "ns", [], [])) == []


def test_the_condition_calls_refuse_what_kubeflow_refuses_before_connecting():
    client = offline_client()
    with pytest.raises(ValueError, match="job_kind='MXJob'"):
        client.get_job_conditions("g", job_kind="MXJob")
    with pytest.raises(ValueError, match="job= is the GangState get_job returns here"):
        client.is_job_running(job={"kind": "PyTorchJob"})
    with pytest.raises(ValueError, match="give the job's name"):
        client.is_job_created()
    with pytest.raises(ValueError, match="must be subset of"):
        client.wait_for_job_conditions("g", expected_conditions={"Done"})
