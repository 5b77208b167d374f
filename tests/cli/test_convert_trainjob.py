"""`trainhook convert` on Kubeflow Trainer v2 TrainJobs: each example converts to valid manifests whose pods, as
`trainhook explain` admits them through the webhook's own code, get what Trainer gives the same job.

The references are transcribed from kubeflow/trainer (pkg/runtime/framework/plugins/torch/torch.go: PET_NNODES,
PET_NPROC_PER_NODE, PET_NODE_RANK from the completion index, PET_MASTER_ADDR `<job>-node-0-0.<job>`,
PET_MASTER_PORT 29400; plugins/mpi/mpi.go: runLauncherAsNode runs a launcher and max(numNodes - 1, 1) nodes, the
hostfile at /etc/mpi/hostfile, slots numProcPerNode or the GPU count), computed here from the TrainJob and not
from convert's output.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rendered import by_kind, validate_objects
from trainhook.cli import main
from trainhook.convert import BUILTIN_RUNTIMES, convert_text
from trainhook.gang import keys
from trainhook.render import to_yaml
from trainhook.render.explain import explain_text, pod_name

ROOT = Path(__file__).resolve().parents[2]
TRAINJOBS = ROOT / "examples" / "trainjob"
EXAMPLES = sorted(TRAINJOBS.glob("*.yaml"))


def trainjob_of(path: Path) -> dict:
    return next(d for d in yaml.safe_load_all(path.read_text()) if d["kind"] == "TrainJob")


def runtime_of(path: Path, job: dict) -> dict:
    in_file = [d for d in yaml.safe_load_all(path.read_text()) if d["kind"].endswith("TrainingRuntime")]
    return in_file[0] if in_file else BUILTIN_RUNTIMES[job["spec"]["runtimeRef"]["name"]]


def trainer_pods(job: dict, runtime: dict) -> int:
    """How many pods Trainer runs for the job (torch: numNodes; mpi with runLauncherAsNode: 1 + max(n - 1, 1))."""
    nodes = job["spec"].get("trainer", {}).get("numNodes", runtime["spec"]["mlPolicy"].get("numNodes", 1))
    mpi = runtime["spec"]["mlPolicy"].get("mpi")
    return 1 + max(nodes - 1, 1) if mpi and mpi.get("runLauncherAsNode") else nodes


def explained(objects: list[dict]) -> dict[str, dict[str, str]]:
    return {pod_name(item.pod): dict(item.injected) for item in explain_text(to_yaml(objects)).pods}


def test_the_examples_cover_the_built_in_runtimes_and_a_file_given_one():
    named = {trainjob_of(p)["spec"]["runtimeRef"]["name"] for p in EXAMPLES}
    assert set(BUILTIN_RUNTIMES) <= named  # torch-distributed, deepspeed-distributed, mpi-distributed
    assert set(BUILTIN_RUNTIMES) == {"torch-distributed", "deepspeed-distributed", "mpi-distributed"}
    assert named - set(BUILTIN_RUNTIMES)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
@pytest.mark.parametrize("kind", ["statefulset", "job"])
def test_each_trainjob_example_converts_to_valid_manifests_of_trainers_size(example, kind):
    converted = convert_text(example.read_text(), str(example), kind)
    validate_objects(converted.objects)
    job = trainjob_of(example)
    name = job["metadata"]["name"]
    workloads = by_kind(converted.objects)["StatefulSet" if kind == "statefulset" else "Job"]
    assert [w["metadata"]["name"] for w in workloads] == [f"{name}-node-0"]  # Trainer's Job name
    count = workloads[0]["spec"]["replicas" if kind == "statefulset" else "completions"]
    assert count == trainer_pods(job, runtime_of(example, job))
    assert converted.objects[0]["kind"] == "Service" and converted.objects[0]["metadata"]["name"] == name
    assert not any(o["apiVersion"].startswith("trainer.kubeflow.org/") for o in converted.objects)
    pods = explained(converted.objects)
    assert len(pods) == count


@pytest.mark.parametrize("example", ["torch.yaml", "custom-runtime.yaml"])
def test_a_torch_trainjobs_pods_get_the_variables_trainer_gives_them(example):
    path = TRAINJOBS / example
    job = trainjob_of(path)
    name, trainer = job["metadata"]["name"], job["spec"]["trainer"]
    runtime = runtime_of(path, job)
    limits = trainer["resourcesPerNode"]["limits"]
    declared = str(trainer.get("numProcPerNode", runtime["spec"]["mlPolicy"]["torch"]["numProcPerNode"]))
    # Trainer's torch plugin: auto without a GPU resource is the CPU limit; gpu and a number are kept
    nproc = str(limits["cpu"]) if declared == "auto" and not any("gpu" in r for r in limits) else declared
    pods = explained(convert_text(path.read_text(), str(path)).objects)
    assert sorted(pods) == [f"{name}-node-0-{i}" for i in range(trainer["numNodes"])]
    for index, pod in enumerate(sorted(pods)):
        env = pods[pod]
        assert {k: env[k] for k in ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR",
                                    "PET_MASTER_PORT")} == {
            "PET_NNODES": str(trainer["numNodes"]), "PET_NPROC_PER_NODE": nproc, "PET_NODE_RANK": str(index),
            "PET_MASTER_ADDR": f"{name}-node-0-0.{name}", "PET_MASTER_PORT": "29400"}
        assert env[keys.TH_ADDRESS] == f"{pod}.{name}"  # Trainer's host name under the job's Service


def test_a_torch_trainjob_keeps_its_trainer_fields_in_the_node_container():
    path = TRAINJOBS / "torch.yaml"
    converted = convert_text(path.read_text(), str(path))
    (workload,) = by_kind(converted.objects)["StatefulSet"]
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    trainer = trainjob_of(path)["spec"]["trainer"]
    assert (container["name"], container["image"], container["command"], container["args"]) == \
        ("node", trainer["image"], trainer["command"], trainer["args"])
    assert container["env"] == trainer["env"] and container["resources"] == trainer["resourcesPerNode"]
    assert workload["metadata"]["labels"]["app.kubernetes.io/part-of"] == "mnist"
    assert workload["metadata"]["namespace"] == "team-a"
    assert converted.warnings == [w for w in converted.warnings if "failurePolicy" in w]  # only the retry note


@pytest.mark.parametrize("example", ["deepspeed.yaml", "mpi.yaml"])
def test_an_mpi_trainjob_launches_from_pod_0_like_trainers_launcher_that_runs_as_a_node(example):
    path = TRAINJOBS / example
    job = trainjob_of(path)
    name, runtime = job["metadata"]["name"], runtime_of(path, job)
    converted = convert_text(path.read_text(), str(path))
    (workload,) = by_kind(converted.objects)["StatefulSet"]
    assert workload["metadata"]["labels"][keys.FRAMEWORK] == keys.MPI
    container = workload["spec"]["template"]["spec"]["containers"][0]
    launcher = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    command = job["spec"]["trainer"].get("command") or launcher["containers"][0]["command"]
    assert container["command"] == ["trainhook-launch", "mpirun", "--", *command]
    pods = explained(converted.objects)
    first = pods[f"{name}-node-0-0"]
    assert first["K_MPI_JOB_ROLE"] == "launcher" and first["OMPI_MCA_orte_default_hostfile"] == "/etc/mpi/hostfile"
    gpus = int(((job["spec"]["trainer"].get("resourcesPerNode") or {}).get("limits") or {}).get(keys.GPU_RESOURCE, 0))
    slots = job["spec"]["trainer"].get("numProcPerNode") or (gpus if gpus > 1 else 1)
    assert first["OMPI_MCA_orte_set_default_slots"] == str(slots)
    assert all(pods[p]["K_MPI_JOB_ROLE"] == "worker" for p in pods if p != f"{name}-node-0-0")
    assert any("the nodes ran `/usr/sbin/sshd`" in w and "pod 0 launches" in w for w in converted.warnings)
    assert any("sshAuthMountPath" in w and "kubexec" not in w for w in converted.warnings)


RUNTIME_WITHOUT_LAUNCHER_AS_NODE = """
apiVersion: trainer.kubeflow.org/v1alpha1
kind: ClusterTrainingRuntime
metadata: {name: mpi-two-layout}
spec:
  mlPolicy:
    numNodes: 1
    mpi: {numProcPerNode: 4, mpiImplementation: OpenMPI, sshAuthMountPath: /root/.ssh, runLauncherAsNode: false}
  template:
    spec:
      replicatedJobs:
        - name: launcher
          template:
            metadata: {labels: {trainer.kubeflow.org/trainjob-ancestor-step: trainer}}
            spec:
              template:
                spec:
                  containers: [{name: node, image: example.com/mpi:1, command: [mpirun, /opt/app]}]
        - name: node
          template:
            spec:
              template:
                spec:
                  containers:
                    - name: node
                      image: example.com/mpi:1
                      command: [/usr/sbin/sshd, -De]
                      readinessProbe: {tcpSocket: {port: 2222}}
"""
TWO_LAYOUT_JOB = """
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata: {name: sim}
spec:
  runtimeRef: {name: mpi-two-layout}
  trainer: {numNodes: 3, image: example.com/mpi:2, env: [{name: A, value: "1"}]}
"""


def test_an_mpi_runtime_without_runlauncherasnode_from_a_runtime_file_becomes_a_launcher_and_workers(tmp_path, capsys):
    (tmp_path / "job.yaml").write_text(TWO_LAYOUT_JOB)
    (tmp_path / "runtime.yaml").write_text(RUNTIME_WITHOUT_LAUNCHER_AS_NODE)
    out = tmp_path / "out.yaml"
    assert main(["convert", str(tmp_path / "job.yaml"), "--runtime", str(tmp_path / "runtime.yaml"),
                 "-o", str(out)]) == 0
    objects = list(yaml.safe_load_all(out.read_text()))
    validate_objects(objects)
    launcher, worker = by_kind(objects)["StatefulSet"]
    assert (launcher["metadata"]["name"], launcher["spec"]["replicas"]) == ("sim-launcher", 1)
    assert (worker["metadata"]["name"], worker["spec"]["replicas"]) == ("sim-worker", 3)  # numNodes workers
    assert launcher["metadata"]["annotations"][keys.REPLICAS] == "launcher=1,worker=3"
    assert launcher["metadata"]["annotations"][keys.SLOTS_PER_WORKER] == "4"
    (launched,), (served,) = (w["spec"]["template"]["spec"]["containers"] for w in (launcher, worker))
    assert launched["command"] == ["trainhook-launch", "mpirun", "--", "mpirun", "/opt/app"]
    assert served["command"] == ["trainhook-launch", "mpi-worker"] and "readinessProbe" not in served
    assert launched["image"] == served["image"] == "example.com/mpi:2"  # the trainer's image, as Trainer sets it
    assert served["env"] == [{"name": "A", "value": "1"}]
    stderr = capsys.readouterr().err
    assert "the nodes ran `/usr/sbin/sshd -De`" in stderr and "readinessProbe" in stderr
    pods = explained(objects)
    assert pods["sim-launcher-0"]["OMPI_MCA_orte_set_default_slots"] == "4"
    assert sorted(pods) == ["sim-launcher-0", "sim-worker-0", "sim-worker-1", "sim-worker-2"]


def test_explain_of_a_trainjob_says_to_convert_and_convert_then_works(tmp_path, capsys):
    source = TRAINJOBS / "torch.yaml"
    assert main(["explain", str(source)]) == 1
    assert f"trainhook convert {source} | trainhook explain -" in capsys.readouterr().err
    out = tmp_path / "mnist.yaml"
    assert main(["convert", str(source), "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["explain", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "# pod mnist-node-0-1 (container node)" in shown and "PET_MASTER_ADDR=mnist-node-0-0.mnist" in shown
