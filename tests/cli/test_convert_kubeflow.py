"""`trainhook convert` on Kubeflow's own kinds: each example job converts to valid manifests whose pods, as
`trainhook explain` shows them, get the environment Kubeflow's controller gives the same job.

The reference environments below are transcribed from kubeflow/training-operator v1.8/v1.9
(pkg/controller.v1/<framework>/envvar.go and tensorflow.go's TF_CONFIG). Kubeflow's addresses are its per-pod
Services, `<job>-<role>-<i>` (TF: `<job>-<role>-<i>.<namespace>.svc`); trainhook's are the same pod names under
the gang's headless Service, `<job>-<role>-<i>.<job>` (contract section 3), so the references are compared
with that one substitution, and the documented differences are named where they are checked.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from rendered import by_kind, validate_objects
from trainhook.gang import keys
from trainhook.convert import MPI_IMPLEMENTATION, SLOTS_PER_WORKER, convert_text
from trainhook.render.explain import explain_text
from trainhook.render import to_yaml

ROOT = Path(__file__).resolve().parents[2]
KUBEFLOW = ROOT / "examples" / "kubeflow"
EXAMPLES = sorted(KUBEFLOW.glob("*.yaml"))


def replicas(job: dict) -> list[tuple[str, int]]:
    """(role, count) in Kubeflow's rank order (master/chief first)."""
    specs = next(v for k, v in job["spec"].items() if k.endswith("ReplicaSpecs"))
    order = ["chief", "master", "ps", "launcher", "worker", "evaluator"]
    found = [(name.lower(), spec.get("replicas", 1)) for name, spec in specs.items()]
    return sorted(found, key=lambda item: order.index(item[0]))


def kubeflow_pods(job: dict) -> list[tuple[str, int, int]]:
    """(role, index, global rank) of every pod Kubeflow creates."""
    pods, rank = [], 0
    for role, count in replicas(job):
        for i in range(count):
            pods.append((role, i, rank))
            rank += 1
    return pods


def port_of(job: dict, port_name: str, default: int) -> int:
    for spec in next(v for k, v in job["spec"].items() if k.endswith("ReplicaSpecs")).values():
        for container in spec["template"]["spec"]["containers"]:
            for port in container.get("ports") or []:
                if port.get("name") == port_name:
                    return port["containerPort"]
    return default


def pytorch_reference(job: dict, role: str, index: int, rank: int, gpus: int) -> dict[str, str]:
    """PyTorchJob (v1.8 envvar.go): MASTER_*, WORLD_SIZE, RANK and torchrun's PET_* variables."""
    name, spec = job["metadata"]["name"], job["spec"]
    total = sum(count for _, count in replicas(job))
    nproc = spec.get("nprocPerNode", "auto")
    port = str(port_of(job, "pytorchjob-port", 23456))
    env = {"PYTHONUNBUFFERED": "1", "PET_NPROC_PER_NODE": nproc, "PET_NODE_RANK": str(rank)}
    if "elasticPolicy" in spec:
        policy = spec["elasticPolicy"]
        env.update(PET_RDZV_BACKEND=policy.get("rdzvBackend", "c10d"), PET_MAX_RESTARTS=str(policy["maxRestarts"]),
                   PET_NNODES=f"{policy['minReplicas']}:{policy['maxReplicas']}",
                   PET_RDZV_ENDPOINT=f"{name}-worker-0:{policy.get('rdzvPort', 29400)}")
    else:
        env.update(MASTER_ADDR=f"{name}-master-0", MASTER_PORT=port, PET_MASTER_ADDR=f"{name}-master-0",
                   PET_MASTER_PORT=port, PET_NNODES=str(total), RANK=str(rank),
                   WORLD_SIZE=str(total * int(nproc)) if nproc.isdigit() else str(total))
    if nproc == "auto":  # contract section 4: trainhook's auto is the GPU count (torchrun's would be per CPU)
        env["PET_NPROC_PER_NODE"] = str(gpus or 1)
    return env


def tensorflow_reference(job: dict, role: str, index: int, rank: int, gpus: int) -> dict[str, str]:
    """TFJob: TF_CONFIG with every replica at `<job>-<role>-<i>.<namespace>.svc:2222`, roles sorted."""
    name, namespace = job["metadata"]["name"], job["metadata"].get("namespace", "default")
    cluster = {r: [f"{name}-{r}-{i}.{namespace}.svc:2222" for i in range(count)] for r, count in sorted(replicas(job))}
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": role, "index": index},
                                     "environment": "cloud"}, separators=(",", ":"))}


def xgboost_reference(job: dict, role: str, index: int, rank: int, gpus: int) -> dict[str, str]:
    """XGBoostJob (xgboost.go SetPodEnv): the master runs the tracker; WORKER_ADDRS lists the workers."""
    name = job["metadata"]["name"]
    total = sum(count for _, count in replicas(job))
    port = str(port_of(job, "xgboostjob-port", 9999))
    workers = dict(replicas(job)).get("worker", 0)
    return {"MASTER_PORT": port, "MASTER_ADDR": f"{name}-master-0", "WORLD_SIZE": str(total), "RANK": str(rank),
            "PYTHONUNBUFFERED": "0", "WORKER_PORT": port,
            "WORKER_ADDRS": ",".join(f"{name}-worker-{i}" for i in range(workers))}


def jax_reference(job: dict, role: str, index: int, rank: int, gpus: int) -> dict[str, str]:
    """JAXJob (v1.9 envvar.go): the coordinator is worker 0."""
    name = job["metadata"]["name"]
    return {"PYTHONUNBUFFERED": "1", "COORDINATOR_PORT": str(port_of(job, "jaxjob-port", 6666)),
            "COORDINATOR_ADDRESS": f"{name}-worker-0", "NUM_PROCESSES": str(sum(c for _, c in replicas(job))),
            "PROCESS_ID": str(index)}


def paddle_reference(job: dict, role: str, index: int, rank: int, gpus: int) -> dict[str, str]:
    """PaddleJob (envvar.go), collective mode: worker 0 hosts the rendezvous."""
    name = job["metadata"]["name"]
    port = port_of(job, "master", 36543)
    # Kubeflow gives the host itself $(POD_IP_DUMMY):port (its IP); trainhook 127.0.0.1:port (webhook/admission/frameworks/
    # paddle.py explains why Paddle's launcher needs one or the other, never its DNS name)
    master = "127.0.0.1" if index == 0 else f"{name}-worker-0"
    return {"PYTHONUNBUFFERED": "1", "PADDLE_JOB_ID": name, "PADDLE_NNODES": str(sum(c for _, c in replicas(job))),
            "PADDLE_MASTER": f"{master}:{port}"}


REFERENCES = {"PyTorchJob": pytorch_reference, "TFJob": tensorflow_reference, "XGBoostJob": xgboost_reference,
              "JAXJob": jax_reference, "PaddleJob": paddle_reference}


def trainhook_address(value: str, job: dict) -> str:
    """Kubeflow's per-pod Service names as trainhook's pod addresses under the gang's Service."""
    name, namespace = job["metadata"]["name"], job["metadata"].get("namespace", "default")
    pattern = re.compile(rf"\b({re.escape(name)}-[a-z]+-\d+)(\.{re.escape(namespace)}\.svc)?\b")
    return pattern.sub(lambda m: f"{m.group(1)}.{name}", value)


def gpus_of(pod: dict) -> int:
    limits = (pod["spec"]["containers"][0].get("resources") or {}).get("limits") or {}
    return int(limits.get(keys.GPU_RESOURCE, 0))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_each_kubeflow_example_converts_to_valid_manifests(example):
    converted = convert_text(example.read_text(), str(example))
    validate_objects(converted.objects)
    job = yaml.safe_load(example.read_text())
    workloads = by_kind(converted.objects)["StatefulSet"]
    name = job["metadata"]["name"]
    assert [w["metadata"]["name"] for w in workloads] == [f"{name}-{role}" for role, _ in replicas(job)]
    assert [w["spec"]["replicas"] for w in workloads] == [count for _, count in replicas(job)]
    assert converted.objects[0]["kind"] == "Service" and converted.objects[0]["metadata"]["name"] == name


@pytest.mark.parametrize("example", [p for p in EXAMPLES if not p.name.startswith("mpijob")], ids=lambda p: p.name)
def test_each_converted_pod_gets_the_environment_kubeflow_gives_it(example):
    job = yaml.safe_load(example.read_text())
    explained = explain_text(to_yaml(convert_text(example.read_text(), str(example)).objects))
    name = job["metadata"]["name"]
    assert [p.pod["metadata"]["name"] for p in explained.pods] == \
        [f"{name}-{role}-{i}" for role, i, _ in kubeflow_pods(job)]  # Kubeflow's pod names
    for item, (role, index, rank) in zip(explained.pods, kubeflow_pods(job)):
        env = dict(item.injected)
        reference = REFERENCES[job["kind"]](job, role, index, rank, gpus_of(item.pod))
        for variable, kubeflow_value in reference.items():
            assert variable in env, f"{item.pod['metadata']['name']}: {variable} missing"
            expected = trainhook_address(kubeflow_value, job)
            if variable == "PYTHONUNBUFFERED":  # Kubeflow writes 0 or 1: Python unbuffers on any non-empty value
                assert env[variable] in ("0", "1")
            elif variable == "TF_CONFIG":
                assert json.loads(env[variable]) == json.loads(expected)
            elif variable == "PET_RDZV_ENDPOINT":  # the same host; the port is trainhook's one gang port
                assert env[variable] == f"{expected.rsplit(':', 1)[0]}:{env[keys.TH_PORT]}"
            else:
                assert env[variable] == expected, f"{item.pod['metadata']['name']}: {variable}"
        assert env[keys.TH_RANK] == str(rank) and env[keys.TH_ROLE] == role
        assert env[keys.TH_NAMESPACE] == job["metadata"].get("namespace", "default")


@pytest.mark.parametrize("example", ["mpijob-v1.yaml", "mpijob-v2beta1.yaml"])
def test_an_mpijob_becomes_a_launcher_and_workers_with_the_mpi_keys(example):
    text = (KUBEFLOW / example).read_text()
    converted = convert_text(text, example)
    launcher, worker = by_kind(converted.objects)["StatefulSet"]
    assert launcher["metadata"]["annotations"][SLOTS_PER_WORKER] == "1"
    assert launcher["metadata"]["annotations"][keys.REPLICAS] == "launcher=1,worker=2"
    launcher_container = launcher["spec"]["template"]["spec"]["containers"][0]
    worker_container = worker["spec"]["template"]["spec"]["containers"][0]
    # the launcher's mpirun runs under trainhook-launch mpirun (hostfile, rsh agent, waiting for the workers)
    assert launcher_container["command"][:4] == ["trainhook-launch", "mpirun", "--", "mpirun"]
    assert (worker_container["command"], worker_container.get("args")) == (["trainhook-launch", "mpi-worker"], None)
    if example == "mpijob-v2beta1.yaml":
        assert launcher["metadata"]["annotations"][MPI_IMPLEMENTATION] == "OpenMPI"
        assert launcher_container["args"] == ["-n", "2", "/home/mpiuser/pi"]
        assert keys.CONTAINER not in launcher["metadata"]["annotations"]  # mpi-operator: the first container
        assert keys.CONTAINER not in (launcher["spec"]["template"]["metadata"].get("annotations") or {})
        assert any("the workers ran `/usr/sbin/sshd -De -f /home/mpiuser/.sshd_config`" in w
                   for w in converted.warnings)
        assert any("sshAuthMountPath" in w for w in converted.warnings)
    else:
        assert launcher["metadata"]["annotations"][keys.CONTAINER] == "mpi"
        assert any("the workers had no command" in w for w in converted.warnings)


# The launcher's variables Kubeflow's MPI controllers inject (training-operator pkg/controller.v1/mpi and
# mpi-operator v2 pkg/controller/mpi_job_controller.go; tests/webhook/test_mpi_webhook.py compares them one by one):
# the hostfile and rsh agent at Kubeflow's paths, FQDN hostnames, the slots, and no GPU for a GPU-less launcher.
KUBEFLOW_MPI_LAUNCHER = {"OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
                         "OMPI_MCA_plm_rsh_agent": "/etc/mpi/kubexec.sh",
                         "OMPI_MCA_orte_keep_fqdn_hostnames": "true", "OMPI_MCA_orte_set_default_slots": "1",
                         "NVIDIA_VISIBLE_DEVICES": "", "NVIDIA_DRIVER_CAPABILITIES": "", "K_MPI_JOB_ROLE": "launcher"}


@pytest.mark.parametrize("example", ["mpijob-v1.yaml", "mpijob-v2beta1.yaml"])
def test_a_converted_mpijobs_pods_get_the_environment_kubeflow_gives_them(example):
    text = (KUBEFLOW / example).read_text()
    explained = explain_text(to_yaml(convert_text(text, example).objects))
    name = yaml.safe_load(text)["metadata"]["name"]
    by_name = {item.pod["metadata"]["name"]: dict(item.injected) for item in explained.pods}
    assert sorted(by_name) == [f"{name}-launcher-0", f"{name}-worker-0", f"{name}-worker-1"]
    launcher = by_name[f"{name}-launcher-0"]
    assert {k: launcher.get(k) for k in KUBEFLOW_MPI_LAUNCHER} == KUBEFLOW_MPI_LAUNCHER
    for worker in (by_name[f"{name}-worker-0"], by_name[f"{name}-worker-1"]):
        assert worker["K_MPI_JOB_ROLE"] == "worker" and "OMPI_MCA_plm_rsh_agent" not in worker
    assert [by_name[n][keys.TH_RANK] for n in sorted(by_name)] == ["0", "1", "2"]
