"""Trainer v2's SDK surface without a cluster: `trainhook.TrainerClient`/`CustomTrainer` make the v1 surface's
gang for the same function, keep what Trainer does differently (keyword arguments, its resource names, every pip
index), refuse what has no counterpart naming what to use, and read a gang back as a TrainJob. The same calls
against a real API server with the webhook are tests/cluster/test_sdk_trainer_cluster.py."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

import trainhook
from launcher_outcomes import decided
from rendered import validate_objects
from trainhook.cluster.status import gang_state
from trainhook.gang import keys
from trainhook.sdk import CustomTrainer, TrainerClient, job_manifests
from trainhook.sdk.command import function_command, function_script
from trainhook.sdk.trainer_manifests import node_resources, step_rank, trainjob_manifests, trainjob_of
from trainhook.sdk.trainer_types import BuiltinTrainer, CustomTrainerContainer, KubernetesBackendConfig

IMAGE = "registry.example/torch:1"
CLIENT = TrainerClient(KubernetesBackendConfig(config_file="/nonexistent/kubeconfig"))  # connects on first need


def train_lr(lr, epochs=1):
    import os
    print(f"v2 rank={os.environ.get('RANK', '-')} lr={lr} epochs={epochs}", flush=True)


def no_args():
    print("no args")


def test_the_v2_names_are_exported_lazily_beside_the_v1_ones():
    code = "import sys, trainhook; print('trainhook.sdk' in sys.modules); trainhook.TrainerClient; " \
           "print('trainhook.sdk' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.split() == ["False", "True"]
    assert (trainhook.TrainerClient, trainhook.CustomTrainer) == (TrainerClient, CustomTrainer)
    assert [f.name for f in dataclasses.fields(CustomTrainer)] == [
        "func", "func_args", "packages_to_install", "pip_index_urls", "num_nodes", "resources_per_node", "env"]


def test_func_args_are_keyword_arguments_as_trainer_v2_passes_them(tmp_path):
    script = function_script(train_lr, {"lr": 0.5, "epochs": 3}, unpack=True)
    assert script.endswith('    train_lr(**json.loads(\'{"lr": 0.5, "epochs": 3}\'))\n')
    (tmp_path / "s.py").write_text(script)  # the program the pods run, run here
    ran = subprocess.run([sys.executable, str(tmp_path / "s.py")], capture_output=True, text=True, timeout=60)
    assert ran.stdout == "v2 rank=- lr=0.5 epochs=3\n", ran.stderr
    with pytest.raises(ValueError, match="func_args must be JSON"):
        function_script(train_lr, {"lr": object()}, unpack=True)


def test_a_torch_job_is_the_v1_gang_of_the_same_function():
    """The same function, node count, resources and env through either SDK: the same Service and StatefulSet."""
    runtime = CLIENT.get_runtime("torch-distributed")  # a runtime needs no cluster
    runtime.trainer.image = IMAGE
    trainer = CustomTrainer(func=no_args, num_nodes=3, resources_per_node={"cpu": "2", "memory": "4Gi"},
                            env={"EPOCHS": "2"}, pip_index_urls=[])
    v2 = trainjob_manifests("same", trainer, runtime, namespace="team-a")
    v1 = job_manifests("same", func=no_args, base_image=IMAGE, num_workers=3, namespace="team-a",
                       resources_per_worker={"cpu": "2", "memory": "4Gi"}, env={"EPOCHS": "2"})
    validate_objects(v2)
    assert v2 == v1
    assert v2[1]["spec"]["template"]["spec"]["containers"][0]["command"][-1].splitlines()[-1] == \
        'exec torchrun "$program_path/ephemeral_script.py"'


def test_the_runtime_decides_image_node_count_and_layout():
    def gang(runtime_name, nodes=None):
        runtime = CLIENT.get_runtime(runtime_name)
        return trainjob_manifests("j", CustomTrainer(func=no_args, num_nodes=nodes), runtime)

    torch = gang("torch-distributed")
    assert (torch[1]["spec"]["replicas"], torch[1]["spec"]["template"]["spec"]["containers"][0]["image"]) == (
        1, "pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime")
    deepspeed = gang("deepspeed-distributed", 3)  # runLauncherAsNode: one workload, worker 0 launches
    assert [(o["kind"], o["metadata"]["name"]) for o in deepspeed] == [("Service", "j"), ("StatefulSet", "j")]
    assert (deepspeed[1]["metadata"]["labels"][keys.FRAMEWORK], deepspeed[1]["spec"]["replicas"]) == ("mpi", 3)
    mpi = gang("mpi-distributed", 2)  # a launcher beside num_nodes workers
    assert [(o["metadata"]["name"], o["spec"].get("replicas")) for o in mpi if o["kind"] == "StatefulSet"] == [
        ("j-launcher", 1), ("j-worker", 2)]
    script = gang("jax-distributed")[1]["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    assert script.splitlines()[-1] == 'exec python "$program_path/ephemeral_script.py"'
    for objects in (torch, deepspeed, mpi):
        validate_objects(objects)


@pytest.mark.parametrize("given, amounts", [
    ({"CPU": 2, "Memory": "8Gi", "GPU": 1}, {"cpu": 2, "memory": "8Gi", keys.GPU_RESOURCE: 1}),
    ({"storage": "10Gi", "example.com/Custom-NPU": 1}, {"ephemeral-storage": "10Gi", "example.com/Custom-NPU": 1}),
    ({"mig-1g.5gb": 1}, {"nvidia.com/mig-1g.5gb": 1}),
])
def test_resources_per_node_are_read_as_trainer_reads_them(given, amounts):
    assert node_resources(given) == {"requests": amounts, "limits": amounts}


@pytest.mark.parametrize("given, fragment", [
    ({"gpu": 1, "nvidia.com/gpu": 2}, "nvidia.com/gpu given twice"),
    ({"mig-1g.5gb": 1, "gpu": 1}, "one MIG profile, or whole GPUs"),
    (["cpu"], "must be a dict"),
])
def test_resources_trainer_refuses_are_refused(given, fragment):
    with pytest.raises(ValueError, match=fragment):
        node_resources(given)


def test_every_pip_index_is_used_the_first_as_the_index():
    trainer = CustomTrainer(func=no_args, packages_to_install=["numpy"],
                            pip_index_urls=["https://mirror.example/simple", "https://extra.example/simple"])
    command = trainjob_manifests("p", trainer)[1]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command == function_command(no_args, None, "pytorch", ["numpy"], "https://mirror.example/simple",
                                       extra_index_urls=["https://extra.example/simple"], unpack=True)
    assert "--index-url https://mirror.example/simple --extra-index-url https://extra.example/simple numpy" in \
        command[2]
    assert CustomTrainer(func=no_args).pip_index_urls == []  # pip's own configuration, unless DEFAULT_PIP_INDEX_URLS


@pytest.mark.parametrize("trainer, runtime, fragment", [
    (CustomTrainerContainer(image="me/train:1"), None, "create_job\\(name, base_image=IMAGE, command="),
    (BuiltinTrainer(), None, "BuiltinTrainer .* has no trainhook counterpart"),
    (None, None, "train\\(\\) needs trainer=CustomTrainer"),
    (CustomTrainer(func=no_args), "torchtune-llama3.2-1b", "trainhook runs Trainer's built-in runtimes"),
    (CustomTrainer(func=no_args, num_nodes=0), None, "num_nodes=0: give a whole number of nodes"),
    (CustomTrainer(func=lambda: None), None, "defined with def"),
])
def test_what_has_no_counterpart_is_refused_naming_what_to_use(trainer, runtime, fragment):
    with pytest.raises(ValueError, match=fragment):
        trainjob_manifests("r", trainer, runtime)


def test_the_client_refuses_local_backends_initializers_and_options_before_connecting():
    class LocalProcessBackendConfig:  # Trainer's own class, by name
        pass

    with pytest.raises(ValueError, match="trainhook local"):
        TrainerClient(LocalProcessBackendConfig())
    client = TrainerClient(KubernetesBackendConfig(config_file="/nonexistent/kubeconfig"))
    with pytest.raises(ValueError, match="no dataset or model initializer"):
        client.train(initializer=object(), trainer=CustomTrainer(func=no_args))
    with pytest.raises(ValueError, match="job_manifests"):
        client.train(trainer=CustomTrainer(func=no_args), options=[object()])
    assert [r.name for r in client.list_runtimes()] == [
        "torch-distributed", "deepspeed-distributed", "mpi-distributed", "jax-distributed", "xgboost-distributed"]
    with pytest.raises(ValueError, match="trainhook runs torch-distributed"):
        client.get_runtime("torch")


def pod(name: str, rank: int, phase: str = "Running", gpus: int = 0, nproc: str = "") -> dict:
    limits = {keys.GPU_RESOURCE: gpus} if gpus else {"cpu": "2"}
    env = [{"name": keys.TH_RANK, "value": str(rank)}] + ([{"name": keys.PET_NPROC_PER_NODE, "value": nproc}]
                                                          if nproc else [])
    return {"metadata": {"name": name, "labels": {keys.JOB_NAME: "g", keys.ROLE: "worker", keys.FRAMEWORK: "pytorch"}},
            "spec": {"containers": [{"name": "pytorch", "image": IMAGE, "env": env, "resources": {"limits": limits}}]},
            "status": {"phase": phase, "containerStatuses": [{"name": "pytorch", "state": {"running": {}}}]}}


def sts(outcome=None) -> dict:
    meta = {"name": "g", "labels": {keys.FRAMEWORK: "pytorch", keys.JOB_NAME: "g"},
            "creationTimestamp": "2025-01-02T03:04:05Z", "annotations": outcome.annotations() if outcome else {}}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta,
            "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "pytorch", "image": IMAGE}]}}}}


@pytest.mark.parametrize("workloads, pods, status, steps", [
    ([sts()], [pod("g-1", 1, "Pending"), pod("g-0", 0)], "Created", [("node-0", "g-0"), ("node-1", "g-1")]),
    ([sts()], [pod("g-0", 0), pod("g-1", 1)], "Running", [("node-0", "g-0"), ("node-1", "g-1")]),
    ([sts(decided("g", size=2))], [], "Complete", []),  # scaled to zero: no pods, the shape kept
    ([sts(decided("g", size=2, rank=1, code=3))], [pod("g-0", 0)], "Failed", [("node-0", "g-0")]),
])
def test_a_gang_reads_back_as_a_trainjob(workloads, pods, status, steps):
    job = trainjob_of(gang_state("g", "ns", workloads, pods), workloads, pods)
    assert (job.name, job.status, job.num_nodes, job.runtime.name, job.runtime.trainer.image) == (
        "g", status, 2, "torch-distributed", IMAGE)
    assert job.creation_timestamp.isoformat() == "2025-01-02T03:04:05+00:00"
    assert [(s.name, s.pod_name) for s in job.steps] == steps


def test_steps_report_devices_as_trainer_does():
    pods = [pod("g-0", 0, gpus=2, nproc="2"), pod("g-1", 1)]
    job = trainjob_of(gang_state("g", "ns", [sts()], pods), [sts()], pods)
    assert [(s.name, s.status, s.device, s.device_count) for s in job.steps] == [
        ("node-0", "Running", "gpu", "2"), ("node-1", "Running", "cpu", "2")]
    assert json.loads(json.dumps(dataclasses.asdict(job.steps[0]))) == {
        "name": "node-0", "status": "Running", "pod_name": "g-0", "device": "gpu", "device_count": "2"}


@pytest.mark.parametrize("step, rank, fragment", [
    ("node-0", 0, None), ("node-12", 12, None),
    ("dataset-initializer", None, "no initializer steps"), ("worker-0", None, "give node-<rank>"),
])
def test_steps_name_ranks(step, rank, fragment):
    if fragment is None:
        assert step_rank(step) == rank
    else:
        with pytest.raises(ValueError, match=fragment):
            step_rank(step)
