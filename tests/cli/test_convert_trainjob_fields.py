"""`trainhook convert` of a TrainJob, field by field: what maps (lifecycle, overrides, scheduling), what is named in
a warning with its value, and what is refused with the fix (a runtime convert cannot find, a container without a
command, an override of a job or container the runtime lacks). The table is docs/use/convert.md's "TrainJob"."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from rendered import by_kind, validate_objects
from trainhook.cli import main
from trainhook.convert import ConvertError, convert_text, convert_trainjob
from trainhook.gang import keys
from trainhook.render import ACTIVE_DEADLINE_SECONDS, ON_FAILURE

API = "trainer.kubeflow.org/v1alpha1"


def trainjob(runtime: str = "torch-distributed", **spec) -> dict:
    body = {"runtimeRef": {"name": runtime},
            "trainer": {"image": "example.com/train:1", "command": ["torchrun", "/app/train.py"], "numNodes": 2}}
    body.update(spec)
    return {"apiVersion": API, "kind": "TrainJob", "metadata": {"name": "tj"}, "spec": body}


def torch_runtime(name: str = "custom", kind: str = "ClusterTrainingRuntime", **extra) -> dict:
    node = {"name": "node", "template": {"metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step":
                                                                  "trainer"}},
                                         "spec": {"template": {"spec": {"containers": [
                                             {"name": "node", "image": "example.com/base:1"},
                                             {"name": "sidecar", "image": "example.com/side:1"}]}}}}}
    runtime = {"apiVersion": API, "kind": kind, "metadata": {"name": name},
               "spec": {"mlPolicy": {"numNodes": 1, "torch": {"numProcPerNode": 1}},
                        "template": {"spec": {"replicatedJobs": [node]}}}}
    runtime["spec"].update(extra)
    return runtime


def the_workload(converted, kind: str = "StatefulSet") -> dict:
    (workload,) = by_kind(converted.objects)[kind]
    return workload


def test_a_runtime_convert_cannot_find_is_refused_naming_runtime_file_and_the_built_in_ones():
    with pytest.raises(ConvertError) as e:
        convert_trainjob(trainjob("torch-cuda-251"))
    message = str(e.value)
    assert "ClusterTrainingRuntime torch-cuda-251, which is not in the input" in message
    assert "--runtime FILE" in message and "kubectl get clustertrainingruntime torch-cuda-251 -o yaml" in message
    assert "torch-distributed, deepspeed-distributed, mpi-distributed" in message


def test_a_training_runtime_serves_only_trainjobs_of_its_namespace():
    runtime = torch_runtime(kind="TrainingRuntime")
    runtime["metadata"]["namespace"] = "team-b"
    job = trainjob("custom")
    job["spec"]["runtimeRef"]["kind"] = "TrainingRuntime"
    job["metadata"]["namespace"] = "team-a"
    with pytest.raises(ConvertError, match="TrainingRuntime custom, which is not in the input.*-n team-a"):
        convert_trainjob(job, [runtime])
    runtime["metadata"]["namespace"] = "team-a"
    assert the_workload(convert_trainjob(job, [runtime]))["metadata"]["namespace"] == "team-a"


def test_a_stream_of_runtimes_alone_is_refused_and_an_unused_runtime_is_warned():
    with pytest.raises(ConvertError, match="only training runtimes: give the TrainJob that names one"):
        convert_text(yaml.safe_dump(torch_runtime()), "rt.yaml")
    stream = yaml.safe_dump_all([torch_runtime("unused"), trainjob()])
    converted = convert_text(stream, "both.yaml")
    assert any(w.startswith("ClusterTrainingRuntime/unused: no TrainJob in the input names it") for w in
               converted.warnings)
    assert not any(o["kind"] == "ClusterTrainingRuntime" for o in converted.objects)


def test_a_runtime_file_holding_anything_else_is_refused(tmp_path, capsys):
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(trainjob("custom")))
    (tmp_path / "rt.yaml").write_text(yaml.safe_dump_all([torch_runtime(), {"apiVersion": "v1", "kind": "ConfigMap",
                                                                            "metadata": {"name": "cfg"}}]))
    assert main(["convert", str(tmp_path / "job.yaml"), "--runtime", str(tmp_path / "rt.yaml")]) == 1
    assert f"--runtime {tmp_path / 'rt.yaml'}: holds ConfigMap/cfg" in capsys.readouterr().err


def test_a_trainer_container_without_a_command_is_refused_unless_the_entrypoint_is_given():
    job = trainjob()
    del job["spec"]["trainer"]["command"]
    with pytest.raises(ConvertError, match="container node has no command.*write spec.trainer.command"):
        convert_trainjob(job)
    converted = convert_trainjob(job, entrypoint=["python", "/app/train.py"])
    assert the_workload(converted)["spec"]["template"]["spec"]["containers"][0]["command"] == \
        ["python", "/app/train.py"]


def test_a_key_trainhook_never_reads_is_refused():
    job = trainjob()
    job["metadata"]["annotations"] = {"trainhook.dev/max-restart": "2"}
    with pytest.raises(ConvertError, match="trainhook.dev/max-restarts"):
        convert_trainjob(job)


@pytest.mark.parametrize("kind", ["statefulset", "job"])
def test_lifecycle_fields_map_to_the_gangs_or_are_warned(kind):
    converted = convert_trainjob(trainjob(suspend=True, activeDeadlineSeconds=600,
                                          managedBy="kueue.x-k8s.io/multikueue"), workload_kind=kind)
    validate_objects(converted.objects)
    workload = the_workload(converted, "StatefulSet" if kind == "statefulset" else "Job")
    assert workload["metadata"]["annotations"][ACTIVE_DEADLINE_SECONDS] == "600"
    assert any("spec.managedBy=kueue.x-k8s.io/multikueue" in w for w in converted.warnings)
    if kind == "job":
        assert workload["spec"]["suspend"] is True and workload["spec"]["activeDeadlineSeconds"] == 600
        assert not any("spec.suspend" in w for w in converted.warnings)
    else:
        assert any("spec.suspend=true: a StatefulSet cannot be suspended" in w for w in converted.warnings)


def test_initializers_are_warned_and_left_out():
    runtime = torch_runtime()
    initializer = copy.deepcopy(runtime["spec"]["template"]["spec"]["replicatedJobs"][0])
    initializer["name"] = "model-initializer"
    initializer["template"]["metadata"]["labels"]["trainer.kubeflow.org/trainjob-ancestor-step"] = "model-initializer"
    runtime["spec"]["template"]["spec"]["replicatedJobs"].insert(0, initializer)
    converted = convert_trainjob(trainjob("custom", initializer={"model": {"storageUri": "hf://org/model"}}),
                                 [runtime])
    assert len(by_kind(converted.objects)["StatefulSet"]) == 1
    assert any("the replicated job model-initializer is an initializer" in w for w in converted.warnings)
    assert any("spec.initializer={model: {storageUri: 'hf://org/model'}}" in w for w in converted.warnings)


OVERRIDE_SPEC = {"serviceAccountName": "trainer-sa", "nodeSelector": {"pool": "gpu"},
                 "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
                 "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
                 "containers": [{"name": "sidecar", "env": [{"name": "MODE", "value": "fast"}],
                                 "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]}


@pytest.mark.parametrize("form", ["podSpecOverrides", "podTemplateOverrides", "runtimePatches"])
def test_each_form_of_pod_template_overrides_is_applied_to_the_jobs_it_targets(form):
    if form == "podSpecOverrides":  # v2.0: the pod spec fields at the top of the entry
        overrides = [{"targetJobs": [{"name": "node"}], **OVERRIDE_SPEC}]
    elif form == "podTemplateOverrides":  # v2.1
        overrides = [{"targetJobs": [{"name": "node"}], "metadata": {"labels": {"team": "a"}}, "spec": OVERRIDE_SPEC}]
    else:
        overrides = [{"manager": "kueue.x-k8s.io/manager", "trainingRuntimeSpec": {"template": {"spec": {
            "replicatedJobs": [{"name": "node", "template": {"spec": {"template": {
                "metadata": {"labels": {"team": "a"}}, "spec": OVERRIDE_SPEC}}}}]}}}}]
    converted = convert_trainjob(trainjob("custom", **{form: overrides}), [torch_runtime()])
    validate_objects(converted.objects)
    template = the_workload(converted)["spec"]["template"]
    spec = template["spec"]
    assert (spec["serviceAccountName"], spec["nodeSelector"], spec["tolerations"], spec["volumes"]) == \
        (OVERRIDE_SPEC["serviceAccountName"], OVERRIDE_SPEC["nodeSelector"], OVERRIDE_SPEC["tolerations"],
         OVERRIDE_SPEC["volumes"])
    sidecar = spec["containers"][1]
    assert sidecar["env"] == [{"name": "MODE", "value": "fast"}] and sidecar["volumeMounts"][0]["mountPath"] == "/data"
    assert (template["metadata"]["labels"].get("team") == "a") == (form != "podSpecOverrides")
    assert the_workload(converted)["metadata"]["annotations"][keys.CONTAINER] == "node"


@pytest.mark.parametrize("override, refused", [
    ({"targetJobs": [{"name": "trainer-node"}], "spec": {"nodeSelector": {"a": "b"}}},
     "targetJobs: trainer-node is not a job of the runtime"),
    ({"targetJobs": [{"name": "node"}], "spec": {"containers": [{"name": "pytorch", "env": []}]}},
     "containers\\[0\\].name=pytorch: the runtime's pod has no such container \\(containers: node, sidecar\\)"),
])
def test_an_override_of_a_job_or_container_the_runtime_lacks_is_refused(override, refused):
    with pytest.raises(ConvertError, match=refused):
        convert_trainjob(trainjob("custom", podTemplateOverrides=[override]), [torch_runtime()])


def test_a_jobset_failure_policy_restarts_the_gang_and_its_absence_is_warned():
    runtime = torch_runtime()
    runtime["spec"]["template"]["spec"]["failurePolicy"] = {"maxRestarts": 3}
    annotations = the_workload(convert_trainjob(trainjob("custom"), [runtime]))["metadata"]["annotations"]
    assert (annotations[ON_FAILURE], annotations[keys.MAX_RESTARTS], annotations[keys.FAILURE_RULES]) == \
        ("restart-gang", "3", "restart-gang: 1-255")
    converted = convert_trainjob(trainjob("custom"), [torch_runtime()])
    assert ON_FAILURE not in the_workload(converted)["metadata"]["annotations"]
    assert any("without a failurePolicy" in w and "fail-gang" in w for w in converted.warnings)


def test_a_runtimes_pod_group_policy_and_kueues_label_choose_the_gang_scheduler():
    runtime = torch_runtime(podGroupPolicy={"coscheduling": {"scheduleTimeoutSeconds": 120}})
    converted = convert_trainjob(trainjob("custom"), [runtime])
    validate_objects(converted.objects)
    (group,) = by_kind(converted.objects)["PodGroup"]
    assert group["spec"] == {"minMember": 2, "scheduleTimeoutSeconds": 120}
    job = trainjob()
    job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a"}
    workload = the_workload(convert_trainjob(job))
    assert workload["metadata"]["annotations"][keys.GANG_SCHEDULER] == "kueue"
    assert workload["spec"]["template"]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"


def test_a_runtime_of_another_ml_policy_is_refused():
    runtime = torch_runtime()
    runtime["spec"]["mlPolicy"] = {"numNodes": 2, "jax": {}}
    with pytest.raises(ConvertError, match="mlPolicy jax: convert converts torch and mpi runtimes"):
        convert_trainjob(trainjob("custom"), [runtime])


def test_torchruns_auto_without_gpus_and_unknown_fields_are_warned():
    job = trainjob(someFutureField=1)
    converted = convert_trainjob(job)
    assert any("numProcPerNode=auto on pods without nvidia.com/gpu" in w for w in converted.warnings)
    assert any("spec.someFutureField=1: no trainhook counterpart; left out" in w for w in converted.warnings)
    job["spec"]["trainer"]["resourcesPerNode"] = {"requests": {"cpu": "1500m"}}  # Trainer: the CPU count, rounded up
    converted = convert_trainjob(job)
    assert the_workload(converted)["metadata"]["annotations"][keys.NPROC_PER_NODE] == "2"
    assert not any("numProcPerNode=auto" in w for w in converted.warnings)


def test_an_mpirun_hidden_in_a_shell_command_is_warned():
    job = trainjob("deepspeed-distributed")
    job["spec"]["trainer"]["command"] = ["bash", "-c", "pip install x && mpirun python train.py"]
    converted = convert_trainjob(job)
    assert any("runs mpirun (or deepspeed) inside it" in w for w in converted.warnings)
    container = the_workload(converted)["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:4] == ["trainhook-launch", "mpirun", "--", "bash"]


DOC = (Path(__file__).resolve().parents[2] / "docs" / "use" / "convert.md").read_text()
SECTION = DOC[DOC.index("## TrainJob (Kubeflow Trainer v2)"):DOC.index("## Gang schedulers")]


@pytest.mark.parametrize("name", [
    "spec.trainer.image", "spec.trainer.env", "spec.trainer.resourcesPerNode", "spec.trainer.numNodes",
    "spec.trainer.numProcPerNode", "sshAuthMountPath", "mpiImplementation", "elasticPolicy", "podGroupPolicy",
    "failurePolicy.maxRestarts", "spec.initializer", "spec.podSpecOverrides", "spec.podTemplateOverrides",
    "spec.runtimePatches", "spec.activeDeadlineSeconds", "spec.suspend", "spec.managedBy", "spec.labels",
    "--runtime FILE", "torch-distributed", "deepspeed-distributed", "mpi-distributed", "runLauncherAsNode"])
def test_the_docs_trainjob_table_names_each_field_convert_reads(name):
    assert name in SECTION
