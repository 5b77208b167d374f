"""`trainhook convert`, field by field: every Kubeflow field is mapped to its trainhook counterpart or named in a
warning (the table of docs/use/convert.md, which this file keeps honest), templates are kept whole, and bad input
is reported with its place."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rendered import by_kind, validate_objects
from trainhook.gang import keys
from trainhook.cli import main
from trainhook.convert import MPI_IMPLEMENTATION, SLOTS_PER_WORKER, ConvertError, convert_job, convert_text
from trainhook.render.explain import explain_text
from trainhook.render import ACTIVE_DEADLINE_SECONDS, ON_FAILURE, to_yaml

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "use" / "convert.md").read_text()
PYTORCHJOB = yaml.safe_load((ROOT / "examples" / "kubeflow" / "pytorchjob.yaml").read_text())


def job(kind: str = "PyTorchJob", api_version: str = "kubeflow.org/v1", **spec) -> dict:
    """A small Kubeflow job of `kind` (master/chief + 2 workers where the kind has them)."""
    container = {"name": {"PyTorchJob": "pytorch", "TFJob": "tensorflow", "PaddleJob": "paddle",
                          "MPIJob": "mpi"}[kind], "image": "example.com/train:1", "command": ["python", "t.py"]}
    template = {"spec": {"containers": [container]}}
    specs_field, first = {"PyTorchJob": ("pytorchReplicaSpecs", "Master"), "TFJob": ("tfReplicaSpecs", "Chief"),
                          "PaddleJob": ("paddleReplicaSpecs", "Master"),
                          "MPIJob": ("mpiReplicaSpecs", "Launcher")}[kind]
    body = {specs_field: {first: {"replicas": 1, "restartPolicy": "Never", "template": copy.deepcopy(template)},
                          "Worker": {"replicas": 2, "restartPolicy": "Never", "template": copy.deepcopy(template)}}}
    body.update(spec)
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": "j"}, "spec": body}


def nested(path: str, value: object) -> dict:
    head, _, rest = path.partition(".")
    return {head: nested(rest, value) if rest else value}


def merge(base: dict, extra: dict) -> dict:
    for key, value in extra.items():
        base[key] = merge(base.get(key) or {}, value) if isinstance(value, dict) and key in base else value
    return base


def doc_name(path: str) -> str:
    """How docs/use/convert.md names a field: replica specs generically (`<kind>ReplicaSpecs.<Type>.restartPolicy`)."""
    parts = path.split(".")
    if parts[0].endswith("ReplicaSpecs"):
        parts[:2] = ["<kind>ReplicaSpecs", "<Type>"]
    return ".".join(parts)


def annotations(converted) -> dict:
    return by_kind(converted.objects)["StatefulSet"][0]["metadata"].get("annotations") or {}


# (kind, spec field path, value, gang scheduler, expectation): ("annotation", key, value), ("warned", fragment),
# ("podgroup", field, value) or ("template", field, value). docs/use/convert.md lists every path.
FIELDS = [
    ("PyTorchJob", "runPolicy.activeDeadlineSeconds", 600, None, ("annotation", ACTIVE_DEADLINE_SECONDS, "600")),
    # job()'s replica types are restartPolicy Never: Kubeflow retries nothing, whatever backoffLimit says
    # (tests/cli/test_convert_lifecycle.py has backoffLimit with retrying types, and the Indexed Jobs' own fields)
    ("PyTorchJob", "runPolicy.backoffLimit", 3, None, ("warned", "spec.runPolicy.backoffLimit=3: no effect")),
    ("PyTorchJob", "runPolicy.backoffLimit", 3, None, ("annotation", ON_FAILURE, "fail-gang")),
    ("PyTorchJob", "runPolicy.backoffLimit", 0, None, ("annotation", ON_FAILURE, "fail-gang")),
    ("PyTorchJob", "runPolicy.cleanPodPolicy", "None", None, ("warned", "spec.runPolicy.cleanPodPolicy=None")),
    ("PyTorchJob", "runPolicy.ttlSecondsAfterFinished", 60, None,
     ("warned", "spec.runPolicy.ttlSecondsAfterFinished=60")),
    ("PyTorchJob", "runPolicy.suspend", True, None, ("warned", "spec.runPolicy.suspend=true")),
    ("PyTorchJob", "runPolicy.managedBy", "kueue.x-k8s.io/multikueue", None, ("warned", "spec.runPolicy.managedBy=")),
    ("PyTorchJob", "runPolicy.schedulingPolicy.minAvailable", 2, "volcano", ("podgroup", "minMember", 2)),
    ("PyTorchJob", "runPolicy.schedulingPolicy.minAvailable", 2, "kueue", ("annotation", keys.MIN_AVAILABLE, "2")),
    ("PyTorchJob", "runPolicy.schedulingPolicy.minAvailable", 2, None, ("warned", "no gang scheduler named")),
    ("PyTorchJob", "runPolicy.schedulingPolicy.queue", "research", "volcano", ("podgroup", "queue", "research")),
    ("PyTorchJob", "runPolicy.schedulingPolicy.queue", "user-queue", "kueue", ("annotation", keys.QUEUE, "user-queue")),
    ("PyTorchJob", "runPolicy.schedulingPolicy.queue", "q", "coscheduling", ("warned", "has no queues")),
    ("PyTorchJob", "runPolicy.schedulingPolicy.priorityClass", "high", None, ("template", "priorityClassName", "high")),
    ("PyTorchJob", "runPolicy.schedulingPolicy.priorityClass", "high", "volcano",
     ("podgroup", "priorityClassName", "high")),
    ("PyTorchJob", "runPolicy.schedulingPolicy.scheduleTimeoutSeconds", 90, "coscheduling",
     ("podgroup", "scheduleTimeoutSeconds", 90)),
    ("PyTorchJob", "runPolicy.schedulingPolicy.scheduleTimeoutSeconds", 90, "volcano",
     ("warned", "only the coscheduling")),
    ("PyTorchJob", "runPolicy.schedulingPolicy.minResources", {"cpu": "8"}, "volcano",
     ("podgroup", "minResources", {"cpu": "8"})),
    ("PyTorchJob", "runPolicy.schedulingPolicy.minResources", {"cpu": "8"}, "kueue", ("warned", "has no PodGroup")),
    ("PyTorchJob", "elasticPolicy.minReplicas", 1, None, ("annotation", keys.ELASTIC, "1:2")),
    ("PyTorchJob", "elasticPolicy.maxReplicas", 4, None, ("annotation", keys.ELASTIC, "2:4")),
    ("PyTorchJob", "elasticPolicy.maxRestarts", 7, None, ("annotation", keys.MAX_RESTARTS, "7")),
    ("PyTorchJob", "elasticPolicy.rdzvBackend", "etcd", None, ("warned", "spec.elasticPolicy.rdzvBackend=etcd")),
    ("PyTorchJob", "elasticPolicy.rdzvPort", 29400, None, ("annotation", keys.PORT, "29400")),
    ("PyTorchJob", "elasticPolicy.rdzvHost", "h", None, ("warned", "spec.elasticPolicy.rdzvHost=h")),
    ("PyTorchJob", "elasticPolicy.rdzvId", "i", None, ("warned", "spec.elasticPolicy.rdzvId=i")),
    ("PyTorchJob", "elasticPolicy.rdzvConf", [{"key": "k", "value": "v"}], None,
     ("warned", "spec.elasticPolicy.rdzvConf")),
    ("PyTorchJob", "elasticPolicy.standalone", True, None, ("warned", "spec.elasticPolicy.standalone=true")),
    ("PyTorchJob", "elasticPolicy.nProcPerNode", 2, None, ("annotation", keys.NPROC_PER_NODE, "2")),
    ("PyTorchJob", "elasticPolicy.metrics", [{"type": "Resource"}], None, ("warned", "spec.elasticPolicy.metrics")),
    ("PyTorchJob", "nprocPerNode", "gpu", None, ("annotation", keys.NPROC_PER_NODE, "gpu")),
    ("PyTorchJob", "pytorchReplicaSpecs.Worker.restartPolicy", "OnFailure", None,
     ("annotation", ON_FAILURE, "restart-gang")),
    ("PyTorchJob", "pytorchReplicaSpecs.Worker.restartPolicy", "Never", None, ("annotation", ON_FAILURE, "fail-gang")),
    ("PyTorchJob", "pytorchReplicaSpecs.Worker.template.spec.restartPolicy", "OnFailure", None,
     ("warned", "spec.pytorchReplicaSpecs.Worker.template.spec.restartPolicy=OnFailure: Kubeflow replaces it")),
    ("PyTorchJob", "someFutureField", 1, None, ("warned", "spec.someFutureField=1: no trainhook counterpart")),
    ("TFJob", "successPolicy", "AllWorkers", None, ("warned", "spec.successPolicy=AllWorkers")),
    ("TFJob", "enableDynamicWorker", True, None, ("warned", "spec.enableDynamicWorker=true")),
    ("PaddleJob", "elasticPolicy.minReplicas", 1, None, ("warned", "spec.elasticPolicy=")),
    ("MPIJob", "slotsPerWorker", 4, None, ("annotation", SLOTS_PER_WORKER, "4")),
    ("MPIJob", "mainContainer", "mpi", None, ("annotation", keys.CONTAINER, "mpi")),
    ("MPIJob", "cleanPodPolicy", "Running", None, ("warned", "spec.cleanPodPolicy=Running")),
    ("MPIJob/v2beta1", "mpiImplementation", "Intel", None, ("annotation", MPI_IMPLEMENTATION, "Intel")),
    ("MPIJob/v2beta1", "launcherCreationPolicy", "WaitForWorkersReady", None, ("annotation", keys.GANG_WAIT, "tcp")),
    ("MPIJob/v2beta1", "sshAuthMountPath", "/home/u/.ssh", None, ("warned", "spec.sshAuthMountPath=/home/u/.ssh")),
    ("MPIJob/v2beta1", "runLauncherAsWorker", True, None, ("warned", "spec.runLauncherAsWorker=true")),
    ("MPIJob/v2beta1", "launcherCreationPolicy", "Later", None, ("warned", "spec.launcherCreationPolicy=Later")),
]


@pytest.mark.parametrize("kind, path, value, scheduler, expected", FIELDS,
                         ids=[f"{k}:{p}={v}:{s}" for k, p, v, s, _ in FIELDS])
def test_every_kubeflow_field_is_mapped_or_warned(kind, path, value, scheduler, expected):
    name, _, version = kind.partition("/")
    source = job(name, f"kubeflow.org/{version or 'v1'}")
    if scheduler == "kueue":  # Kueue admits through a queue: every Kueue job names one
        source["metadata"]["labels"] = {keys.KUEUE_QUEUE_NAME: "user-queue"}
    merge(source["spec"], nested(path, value))
    converted = convert_job(source, gang_scheduler=scheduler)
    validate_objects(converted.objects)
    what = expected[0]
    if what == "annotation":
        assert annotations(converted).get(expected[1]) == expected[2], converted.warnings
    elif what == "warned":
        assert any(expected[1] in warning for warning in converted.warnings), converted.warnings
    elif what == "podgroup":
        assert converted.objects[-1]["kind"] == "PodGroup"
        assert converted.objects[-1]["spec"][expected[1]] == expected[2]
    else:
        for workload in by_kind(converted.objects)["StatefulSet"]:
            assert workload["spec"]["template"]["spec"][expected[1]] == expected[2]
    assert f"`spec.{doc_name(path)}`" in DOC, f"docs/use/convert.md does not list spec.{doc_name(path)}"


def test_templates_are_kept_whole():
    converted = convert_job(PYTORCHJOB)
    validate_objects(converted.objects)
    master, worker = by_kind(converted.objects)["StatefulSet"]
    for workload, replica in ((master, "Master"), (worker, "Worker")):
        original = copy.deepcopy(PYTORCHJOB["spec"]["pytorchReplicaSpecs"][replica]["template"]["spec"])
        kept = copy.deepcopy(workload["spec"]["template"]["spec"])
        assert kept.pop("restartPolicy") == "Always"  # a StatefulSet's only policy; OnFailure became on-failure
        assert kept == original  # containers (env, resources, mounts, ports), tolerations, volumes
        assert workload["metadata"]["namespace"] == "team-a"
    assert annotations(converted) == {keys.CONTAINER: "pytorch", keys.PORT: "23456", ACTIVE_DEADLINE_SECONDS: "7200",
                                      ON_FAILURE: "restart-gang", keys.MAX_RESTARTS: "2",
                                      keys.FAILURE_RULES: "restart-gang: 1-255",  # OnFailure: any exit code
                                      keys.REPLICAS: "master=1,worker=3"}


def test_indexed_jobs_keep_the_deadline_and_leave_the_retries_to_the_gang():
    converted = convert_job(PYTORCHJOB, workload_kind="job")
    validate_objects(converted.objects)
    for workload in by_kind(converted.objects)["Job"]:
        spec = workload["spec"]
        # runPolicy.backoffLimit 2 is the gang's restart budget, never a Job's (docs/use/gang-lifecycle.md)
        assert (spec["activeDeadlineSeconds"], spec["backoffLimit"], spec["completionMode"]) == (7200, 0, "Indexed")
        assert spec["template"]["spec"]["restartPolicy"] == "OnFailure"
        assert (workload["metadata"]["annotations"][ON_FAILURE],
                workload["metadata"]["annotations"][keys.MAX_RESTARTS]) == ("restart-gang", "2")


def test_the_job_says_which_gang_scheduler_it_was_written_for():
    kueue = job()
    kueue["metadata"]["labels"] = {keys.KUEUE_QUEUE_NAME: "user-queue", "team": "a"}
    converted = convert_job(kueue)
    sts = by_kind(converted.objects)["StatefulSet"][0]
    assert sts["metadata"]["labels"]["team"] == "a" and keys.KUEUE_QUEUE_NAME not in sts["metadata"]["labels"]
    assert annotations(converted)[keys.GANG_SCHEDULER] == "kueue" and annotations(converted)[keys.QUEUE] == "user-queue"
    volcano = job(runPolicy={"schedulingPolicy": {"queue": "research"}})
    for spec in volcano["spec"]["pytorchReplicaSpecs"].values():
        spec["template"]["spec"]["schedulerName"] = "volcano"
    converted = convert_job(volcano)
    validate_objects(converted.objects)
    assert converted.objects[-1]["spec"] == {"minMember": 3, "queue": "research"}


def test_a_missing_training_container_is_warned_and_the_first_used():
    source = job()
    source["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["name"] = "trainer"
    converted = convert_job(source)
    assert any("Worker: no container named pytorch (containers: trainer)" in w for w in converted.warnings)
    master, worker = by_kind(converted.objects)["StatefulSet"]
    assert master["spec"]["template"]["metadata"]["annotations"] == {keys.CONTAINER: "pytorch"}
    assert keys.CONTAINER not in (worker["spec"]["template"]["metadata"].get("annotations") or {})
    explained = explain_text(to_yaml(converted.objects))  # the webhook accepts both roles
    assert [item.container for item in explained.pods] == ["pytorch", "trainer", "trainer"]


def test_a_container_without_command_is_refused_unless_its_entrypoint_is_given():
    """Issue 25: convert wrote manifests the webhook refuses (the image's ENTRYPOINT cannot be read at admission);
    now it refuses, naming every such container and the three fixes, and each fix works."""
    source = job("TFJob")
    for replica in source["spec"]["tfReplicaSpecs"].values():
        replica["template"]["spec"]["containers"][0].pop("command")
    with pytest.raises(ConvertError) as refused:
        convert_job(source)
    assert str(refused.value).startswith(
        "TFJob/j: spec.tfReplicaSpecs.Chief: container tensorflow and spec.tfReplicaSpecs.Worker: container "
        "tensorflow have no command: it would run its image's ENTRYPOINT, which trainhook's webhook cannot read")
    assert "--entrypoint '[\"python\", \"/app/train.py\"]'" in str(refused.value)
    assert f"annotate the job {keys.ENTRYPOINT}" in str(refused.value)
    given = convert_job(source, entrypoint=["python", "/app/train.py"])  # --entrypoint: written as the command
    assert given.warnings == []
    for workload in by_kind(given.objects)["StatefulSet"]:
        assert workload["spec"]["template"]["spec"]["containers"][0]["command"] == ["python", "/app/train.py"]
    assert [p.pod["spec"]["containers"][0]["command"][-2:] for p in explain_text(to_yaml(given.objects)).pods] == \
        [["python", "/app/train.py"]] * 3
    source["metadata"]["annotations"] = {keys.ENTRYPOINT: '["python", "/app/train.py"]'}
    converted = convert_job(source)
    assert converted.warnings == []
    explain_text(to_yaml(converted.objects))  # the webhook accepts every pod
    source["metadata"]["annotations"] = {keys.ENTRYPOINT: "python /app/train.py"}  # not the contract's JSON list
    with pytest.raises(ConvertError, match=r"entrypoint='python /app/train.py': not an entrypoint: a plain string.*"
                                           r'e\.g\. \["python", "/app/train\.py"\]'):
        convert_job(source)


@pytest.mark.parametrize("text, message", [
    ("apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata:\n  name: x\n spec: {}\n",
     "job.yaml:5:2: invalid YAML"),
    ("apiVersion: kubeflow.org/v1\nkind: MXJob\nmetadata: {name: x}\n",
     "MXJob/x: kubeflow.org/v1 MXJob is not a Kubeflow job convert knows; it converts PyTorchJob (kubeflow.org/v1)"),
    ("apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata: {name: x}\nspec: {}\n",
     "PyTorchJob/x: spec.pytorchReplicaSpecs is required"),
    ("apiVersion: kubeflow.org/v1\nkind: TFJob\nmetadata: {name: x}\nspec: {tfReplicaSpecs: {Boss: {}}}\n",
     "spec.tfReplicaSpecs.Boss: not a TFJob replica type"),
    ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", "job.yaml: no Kubeflow job"),
    ("- 1\n- 2\n", "job.yaml: document 1 is a list"),
])
def test_bad_input_is_reported_with_its_place(text, message):
    with pytest.raises(ConvertError) as raised:
        convert_text(text, "job.yaml")
    assert message in str(raised.value)


def test_other_objects_pass_through_and_several_jobs_convert(tmp_path):
    text = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: script}\ndata: {a: b}\n---\n" + \
        yaml.safe_dump(job()) + "---\n" + yaml.safe_dump(job("TFJob"))
    converted = convert_text(text)
    assert [o["kind"] for o in converted.objects] == ["ConfigMap", "Service", "StatefulSet", "StatefulSet",
                                                      "Service", "StatefulSet", "StatefulSet"]


def test_the_cli_prints_manifests_and_warns_on_stderr(tmp_path, capsys):
    source = tmp_path / "job.yaml"
    source.write_text(yaml.safe_dump(job(runPolicy={"cleanPodPolicy": "All"})))
    assert main(["convert", str(source), "--kind", "job", "-n", "team-a"]) == 0
    out, err = capsys.readouterr()
    objects = list(yaml.safe_load_all(out))
    validate_objects(objects)
    assert [o["metadata"]["namespace"] for o in objects] == ["team-a"] * 3
    assert err == ("Warning: PyTorchJob/j: spec.runPolicy.cleanPodPolicy=All: an Indexed Job's pods end with the gang "
                   "and stay until the Job is deleted (trainhook delete, or spec.runPolicy.ttlSecondsAfterFinished); "
                   "left out\n")
    assert main(["convert", str(source), "-o", str(tmp_path / "out.yaml")]) == 0
    assert capsys.readouterr().out == ""
    assert len(list(yaml.safe_load_all((tmp_path / "out.yaml").read_text()))) == 3
    source.write_text("kind: [")
    assert main(["convert", str(source)]) == 1
    assert capsys.readouterr().err.startswith(f"error: {source}:1:8: invalid YAML")


def test_the_console_script_converts_from_standard_input():
    result = subprocess.run([sys.executable, "-m", "trainhook.cli", "convert", "-", "--gang-scheduler", "volcano"],
                            input=(ROOT / "examples" / "kubeflow" / "tfjob.yaml").read_text(), capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    objects = list(yaml.safe_load_all(result.stdout))
    validate_objects(objects)
    assert objects[-1]["spec"] == {"minMember": 4}
    assert "spec.successPolicy=AllWorkers" in result.stderr


@pytest.mark.parametrize("kind, replica_type, replicas, refused", [
    ("PyTorchJob", "Master", 2, "Kubeflow allows exactly one Master per PyTorchJob"),
    ("PyTorchJob", "Master", 0, "Kubeflow allows exactly one Master per PyTorchJob"),
    ("MPIJob", "Launcher", 2, "Kubeflow allows exactly one Launcher per MPIJob"),
    ("PaddleJob", "Master", 3, "trainhook's webhook runs exactly one master"),
])
def test_a_second_master_or_launcher_is_refused_as_kubeflow_and_the_webhook_refuse_it(kind, replica_type, replicas,
                                                                                       refused, tmp_path, capsys):
    """Issue 34: convert used to succeed on `Master.replicas: 2` while `trainhook explain` of its output refused."""
    body = job(kind)
    specs = next(v for k, v in body["spec"].items() if k.endswith("ReplicaSpecs"))
    specs[replica_type]["replicas"] = replicas
    with pytest.raises(ConvertError) as e:
        convert_job(body)
    message = str(e.value)
    assert refused in message and f"{replica_type}.replicas={replicas}" in message
    assert f"set {replica_type}.replicas: 1" in message
    if replicas > 1:  # the fix keeps the pod count: the extra masters become workers
        assert f"Worker (Worker.replicas: {2 + replicas - 1})" in message
    source = tmp_path / "job.yaml"
    source.write_text(yaml.safe_dump(body))
    assert main(["convert", str(source)]) == 1
    assert refused in capsys.readouterr().err


def test_one_master_is_what_explain_admits_so_the_converted_job_is_never_a_trap():
    converted = convert_job(job("PyTorchJob"))
    assert [p.pod["metadata"]["name"] for p in explain_text(to_yaml(converted.objects)).pods] == \
        ["j-master-0", "j-worker-0", "j-worker-1"]


@pytest.mark.parametrize("api_version, field", [("kubeflow.org/v1", None), ("kubeflow.org/v2beta1", "sshAuthMountPath")])
def test_mpi_warnings_describe_the_gang_transport_not_kubexec(api_version, field):
    """The MPI transport is the launcher's `gang` rsh agent (launcher/mpi/kubexec.py, docs/use/frameworks/mpi.md); the
    warnings must not send a user looking for exec permissions that convert's output never needs."""
    body = job("MPIJob", api_version, **({field: "/root/.ssh"} if field else {}))
    for spec in body["spec"]["mpiReplicaSpecs"].values():
        spec["template"]["spec"]["containers"][0]["name"] = "mpi"
    body["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["command"] = ["/usr/sbin/sshd"]
    warnings = convert_job(body).warnings
    about_workers = [w for w in warnings if "mpi-worker" in w]
    assert about_workers and all("gang transport" in w and "authenticated port" in w for w in about_workers)
    assert not any("kubexec" in w or "exec API" in w for w in warnings)
    if field:
        assert any(w.startswith("MPIJob/j: spec.sshAuthMountPath=/root/.ssh: trainhook's MPI gangs mount no ssh keys")
                   for w in warnings)
