"""`trainhook convert` and a Kubeflow job's lifecycle (docs/use/gang-lifecycle.md, docs/use/convert.md): a Job trainhook
writes never retries pods on its own (`backoffLimit: 0`, the gang's launchers retry it whole), Kubeflow's retries
become the gang's (`runPolicy.backoffLimit` and the replica types' `restartPolicy`, Kubeflow's defaults included),
and every lifecycle field either becomes its counterpart or is named in a warning that says what happens instead,
for StatefulSets and Indexed Jobs alike."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import yaml

from test_convert_fields import job
from rendered import by_kind, validate_objects
from trainhook.gang import keys
from trainhook.cli import main
from trainhook.convert import ConvertError, convert_job, convert_text
from trainhook.render.explain import explain_text
from trainhook.gang.failure_rules import FailureRules
from trainhook.render import ON_FAILURE, RenderOptions, render

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples" / "kubeflow").glob("*.yaml"))


def retrying(kind: str = "PyTorchJob", restart: str | None = "OnFailure", api_version: str = "kubeflow.org/v1",
             **spec) -> dict:
    """test_convert_fields.job with every replica type's restartPolicy `restart` (None: the job names none)."""
    source = job(kind, api_version, **spec)
    for replica in next(v for k, v in source["spec"].items() if k.endswith("ReplicaSpecs")).values():
        replica.pop("restartPolicy")
        if restart is not None:
            replica["restartPolicy"] = restart
    return source


def workloads(converted) -> list[dict]:
    found = by_kind(converted.objects)
    return found.get("StatefulSet", []) + found.get("Job", [])


def lifecycle(converted) -> tuple[str, str | None]:
    """(on-failure, max-restarts), the same on every workload."""
    seen = {(w["metadata"]["annotations"][ON_FAILURE], w["metadata"]["annotations"].get(keys.MAX_RESTARTS))
            for w in workloads(converted)}
    assert len(seen) == 1, seen
    return seen.pop()


def failure_rules(converted) -> str | None:
    """trainhook.dev/failure-rules, the same on every workload (None: the default rules)."""
    seen = {w["metadata"]["annotations"].get(keys.FAILURE_RULES) for w in workloads(converted)}
    assert len(seen) == 1, seen
    return seen.pop()


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_convert_kind_job_gives_every_job_backoff_limit_0(example, tmp_path, capsys):
    assert main(["convert", str(example), "--kind", "job", "-o", str(tmp_path / "out.yaml")]) == 0
    jobs = [o for o in yaml.safe_load_all((tmp_path / "out.yaml").read_text()) if o["kind"] == "Job"]
    assert jobs and all(j["spec"]["backoffLimit"] == 0 for j in jobs)


@pytest.mark.parametrize("on_failure", ["", "fail-gang", "restart-gang"])
def test_render_kind_job_gives_every_job_backoff_limit_0(on_failure):
    objects = render(RenderOptions(name="g", image="example.com/train:1", command=["python", "t.py"],
                                   roles=[("master", 1), ("worker", 2)], kind="job", on_failure=on_failure))
    validate_objects(objects)
    assert [j["spec"]["backoffLimit"] for j in by_kind(objects)["Job"]] == [0, 0]


@pytest.mark.parametrize("backoff, restart, expected", [
    (4, "OnFailure", ("restart-gang", "4")),
    (4, "ExitCode", ("restart-gang", "4")),
    (0, "OnFailure", ("fail-gang", None)),
    (None, "ExitCode", ("restart-gang", None)),  # the launcher's default, 3 (warned: Kubeflow has no bound)
    (4, "Never", ("fail-gang", None)),  # Kubeflow counts backoffLimit against retrying types only (warned)
    (None, "Never", ("fail-gang", None)),
])
def test_kubeflows_backoff_limit_is_the_gangs_restart_budget_never_the_jobs(backoff, restart, expected):
    policy = {} if backoff is None else {"backoffLimit": backoff}
    for workload_kind in ("job", "statefulset"):
        converted = convert_job(retrying(restart=restart, runPolicy=policy), workload_kind=workload_kind)
        validate_objects(converted.objects)
        assert lifecycle(converted) == expected
        if workload_kind == "job":
            assert all(w["spec"]["backoffLimit"] == 0 for w in workloads(converted))


def test_the_cli_writes_backoff_limit_0_and_the_gangs_restarts(tmp_path, capsys):
    source = tmp_path / "job.yaml"
    source.write_text(yaml.safe_dump(retrying(restart="ExitCode", runPolicy={"backoffLimit": 5})))
    assert main(["convert", str(source), "--kind", "job"]) == 0
    out, err = capsys.readouterr()
    jobs = [o for o in yaml.safe_load_all(out) if o["kind"] == "Job"]
    assert [(j["spec"]["backoffLimit"], j["metadata"]["annotations"][ON_FAILURE],
             j["metadata"]["annotations"][keys.MAX_RESTARTS]) for j in jobs] == [(0, "restart-gang", "5")] * 2
    assert err == ""  # ExitCode with a bound is exactly what restart-gang does


@pytest.mark.parametrize("kind, api_version, expected", [
    ("PyTorchJob", "kubeflow.org/v1", ("restart-gang", None)),  # Kubeflow's default: OnFailure
    ("PaddleJob", "kubeflow.org/v1", ("restart-gang", None)),  # OnFailure
    ("TFJob", "kubeflow.org/v1", ("fail-gang", None)),  # Never
    ("MPIJob", "kubeflow.org/v1", ("fail-gang", None)),  # Never
    ("MPIJob", "kubeflow.org/v2beta1", ("restart-gang", "6")),  # the launcher Job: OnFailure, its backoffLimit 6
])
def test_a_replica_type_without_restart_policy_gets_kubeflows_default(kind, api_version, expected):
    converted = convert_job(retrying(kind, restart=None, api_version=api_version))
    assert lifecycle(converted) == expected
    # OnFailure restarts a member on any exit code: the gang restarts on any (the default rules fail 1-127).
    assert failure_rules(converted) == ("restart-gang: 1-255" if expected[0] == "restart-gang" else None)
    if expected == ("restart-gang", None):  # no bound: warned, naming the default restartPolicy
        assert any("restartPolicy=OnFailure (Kubeflow's default)" in w for w in converted.warnings), \
            converted.warnings


def test_the_templates_restart_policy_is_overridden_as_in_kubeflow():
    source = retrying(restart=None)  # PyTorchJob: OnFailure by default, whatever the template says
    source["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["restartPolicy"] = "Never"
    converted = convert_job(source, workload_kind="job")
    assert lifecycle(converted)[0] == "restart-gang"
    assert any("spec.pytorchReplicaSpecs.Worker.template.spec.restartPolicy=Never: Kubeflow replaces it with the "
               "replica type's restartPolicy (OnFailure, its default)" in w for w in converted.warnings)
    assert {w["spec"]["template"]["spec"]["restartPolicy"] for w in workloads(converted)} == {"OnFailure"}
    agreeing = retrying(restart="ExitCode")  # ExitCode pods are Never in Kubeflow: nothing to say
    agreeing["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["restartPolicy"] = "Never"
    assert not any("template" in w for w in convert_job(agreeing).warnings)


def test_an_unknown_restart_policy_is_refused_by_name():
    with pytest.raises(ConvertError, match=r"spec.pytorchReplicaSpecs.Master.restartPolicy=Sometimes: use Always, "
                                           r"OnFailure, Never, ExitCode"):
        convert_job(retrying(restart="Sometimes"))


def test_backoff_limit_and_elastic_max_restarts_share_one_annotation():
    source = retrying(runPolicy={"backoffLimit": 2}, elasticPolicy={"maxRestarts": 7})
    converted = convert_job(source)
    assert lifecycle(converted) == ("restart-gang", "7")
    assert any("spec.runPolicy.backoffLimit=2: trainhook.dev/max-restarts is one number for torchrun's and the "
               "gang's restarts, and spec.elasticPolicy.maxRestarts=7 already set it" in w for w in converted.warnings)


# (spec patch, workload kind, gang scheduler, the warning's start, or None: no warning, and what the Jobs get)
FIELDS = [
    ({"runPolicy": {"backoffLimit": 3}}, "job", None,
     "spec.runPolicy.backoffLimit=3: no effect: no replica type retries (restartPolicy Never)", {}),
    ({"runPolicy": {"cleanPodPolicy": "All"}}, "statefulset", None, None, {}),  # scaled to zero: every pod goes
    ({"runPolicy": {"cleanPodPolicy": "Running"}}, "statefulset", None,
     "spec.runPolicy.cleanPodPolicy=Running: a StatefulSet gang's pods are all deleted when it is done", {}),
    ({"runPolicy": {"cleanPodPolicy": "None"}}, "statefulset", None,
     "spec.runPolicy.cleanPodPolicy=None: a StatefulSet gang's pods are all deleted", {}),
    ({"runPolicy": {"cleanPodPolicy": "All"}}, "job", None,
     "spec.runPolicy.cleanPodPolicy=All: an Indexed Job's pods end with the gang and stay", {}),
    ({"runPolicy": {"cleanPodPolicy": "Running"}}, "job", None, None, {}),
    ({"runPolicy": {"cleanPodPolicy": "None"}}, "job", None, None, {}),
    ({"runPolicy": {"ttlSecondsAfterFinished": 600}}, "job", None, None, {"ttlSecondsAfterFinished": 600}),
    ({"runPolicy": {"ttlSecondsAfterFinished": 600}}, "statefulset", None,
     "spec.runPolicy.ttlSecondsAfterFinished=600: nothing deletes a finished StatefulSet gang", {}),
    ({"runPolicy": {"suspend": True}}, "job", None, None, {"suspend": True}),
    ({"runPolicy": {"suspend": True}}, "job", "kueue",
     "spec.runPolicy.suspend=true: Kueue suspends the jobs it queues", {}),
    ({"runPolicy": {"suspend": True}}, "statefulset", None,
     "spec.runPolicy.suspend=true: a StatefulSet cannot be suspended", {}),
    ({"runPolicy": {"suspend": False}}, "job", None, None, {}),
    ({"runPolicy": {"managedBy": "kubeflow.org/training-operator"}}, "job", None, None, {}),
    ({"runPolicy": {"managedBy": "kueue.x-k8s.io/multikueue"}}, "job", None,
     "spec.runPolicy.managedBy=kueue.x-k8s.io/multikueue: trainhook's workloads are run by Kubernetes' own", {}),
    ({"runPolicy": {"activeDeadlineSeconds": 60}}, "job", None, None, {"activeDeadlineSeconds": 60}),
    ({"runPolicy": {"schedulingPolicy": {"minAvailable": 3}}}, "job", None,
     "spec.runPolicy.schedulingPolicy.minAvailable=3: no gang scheduler named", {}),
    ({"runPolicy": {"someFutureField": 1}}, "job", None, "spec.runPolicy.someFutureField=1: no trainhook", {}),
    ({"elasticPolicy": {"standalone": False}}, "job", None, None, {}),
    ({"elasticPolicy": {"standalone": True}}, "job", None, "spec.elasticPolicy.standalone=true: the rendezvous", {}),
    ({"elasticPolicy": {"rdzvBackend": "c10d"}}, "job", None, None, {}),
    ({"nprocPerNode": "4", "elasticPolicy": {"nProcPerNode": 2}}, "job", None,
     "spec.elasticPolicy.nProcPerNode=2: deprecated, and Kubeflow refuses it with spec.nprocPerNode", {}),
]
MPI_FIELDS = [
    ({"runLauncherAsWorker": False}, "kubeflow.org/v2beta1", None),
    ({"runLauncherAsWorker": True}, "kubeflow.org/v2beta1",
     "spec.runLauncherAsWorker=true: the launcher pod is not in the hostfile"),
    ({"launcherCreationPolicy": "AtStartup"}, "kubeflow.org/v2beta1", None),
    ({"sshAuthMountPath": "/root/.ssh"}, "kubeflow.org/v2beta1", "spec.sshAuthMountPath=/root/.ssh: trainhook's"),
    ({"mainContainer": "mpi"}, "kubeflow.org/v2beta1", "spec.mainContainer=mpi: no trainhook counterpart"),  # v1's
    ({"cleanPodPolicy": "Running"}, "kubeflow.org/v1", "spec.cleanPodPolicy=Running: a StatefulSet gang's pods"),
    ({"cleanPodPolicy": "All"}, "kubeflow.org/v1", None),
    ({"cleanPodPolicy": "All"}, "kubeflow.org/v2beta1", "spec.cleanPodPolicy=All: no trainhook counterpart"),
]
TF_FIELDS = [({"successPolicy": ""}, None), ({"enableDynamicWorker": False}, None),
             ({"enableDynamicWorker": True}, "spec.enableDynamicWorker=true: TF_CONFIG lists the gang as created")]


def check(converted, warning: str | None) -> None:
    validate_objects(converted.objects)
    if warning is None:
        assert converted.warnings == []
    else:
        assert len(converted.warnings) == 1 and warning in converted.warnings[0], converted.warnings
        assert converted.warnings[0].endswith("; left out")  # the value is named, and that it is not carried over


@pytest.mark.parametrize("patch, workload_kind, scheduler, warning, job_spec", FIELDS,
                         ids=[f"{yaml.safe_dump(p, default_flow_style=True).strip()}:{k}:{s}"
                              for p, k, s, _, _ in FIELDS])
def test_each_lifecycle_field_is_mapped_or_warned_with_its_value(patch, workload_kind, scheduler, warning,
                                                                  job_spec):
    source = job(**patch)
    if scheduler == "kueue":
        source["metadata"]["labels"] = {keys.KUEUE_QUEUE_NAME: "user-queue"}
    converted = convert_job(source, workload_kind=workload_kind, gang_scheduler=scheduler)
    check(converted, warning)
    for workload in by_kind(converted.objects).get("Job", []):
        assert {k: workload["spec"][k] for k in job_spec} == job_spec
        assert workload["spec"]["backoffLimit"] == 0


@pytest.mark.parametrize("patch, api_version, warning", MPI_FIELDS, ids=lambda v: str(v))
def test_each_mpijob_field_is_mapped_or_warned_with_its_value(patch, api_version, warning):
    source = job("MPIJob", api_version, **patch)
    for replica in source["spec"]["mpiReplicaSpecs"].values():  # no command warnings: the worker is mpi-operator's
        replica["template"]["spec"]["containers"][0]["command"] = ["trainhook-launch", "mpi-worker"]
    source["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"] = ["mpirun", "x"]
    if api_version == "kubeflow.org/v2beta1":  # else mpi-operator's launcher Job reruns it 6 times (restart-gang)
        source["spec"]["runPolicy"] = {"backoffLimit": 0}
    check(convert_job(source), warning)


@pytest.mark.parametrize("patch, warning", TF_FIELDS, ids=lambda v: str(v))
def test_each_tfjob_field_is_mapped_or_warned_with_its_value(patch, warning):
    check(convert_job(job("TFJob", **patch)), warning)


def test_kubeflows_retries_are_compared_with_the_gangs_in_warnings():
    converted = convert_text(yaml.safe_dump(retrying(restart=None)), workload_kind="job")  # OnFailure, no bound
    assert converted.warnings == [
        "PyTorchJob/j: spec.pytorchReplicaSpecs.{Master,Worker}.restartPolicy=OnFailure (Kubeflow's default) "
        "without spec.runPolicy.backoffLimit: Kubeflow retries without bound; trainhook restarts the gang together, "
        "at most 3 times (trainhook.dev/max-restarts)"]
    mixed = retrying(restart="ExitCode", runPolicy={"backoffLimit": 2})
    mixed["spec"]["pytorchReplicaSpecs"]["Master"]["restartPolicy"] = "Never"
    assert convert_job(mixed).warnings == [
        "PyTorchJob/j: spec.pytorchReplicaSpecs.Master.restartPolicy=Never: Kubeflow fails the job when such a member "
        "fails; under restart-gang its failures restart the gang like any member's, as the default failure rules "
        "(exit codes 128 and above) say"]
    mixed["spec"]["pytorchReplicaSpecs"]["Worker"]["restartPolicy"] = "OnFailure"
    assert convert_job(mixed).warnings == [
        "PyTorchJob/j: spec.pytorchReplicaSpecs.Master.restartPolicy=Never: Kubeflow fails the job when such a member "
        "fails; under restart-gang its failures restart the gang like any member's, as 'restart-gang: 1-255' say"]
    # One set of rules for the gang: a type that retries any exit code decides it, the others' are warned.
    exit_code_master = retrying(restart="OnFailure", runPolicy={"backoffLimit": 2})
    exit_code_master["spec"]["pytorchReplicaSpecs"]["Master"]["restartPolicy"] = "ExitCode"
    converted = convert_job(exit_code_master)
    assert failure_rules(converted) == "restart-gang: 1-255"
    assert converted.warnings == [
        "PyTorchJob/j: spec.pytorchReplicaSpecs.Master.restartPolicy=ExitCode next to "
        "spec.pytorchReplicaSpecs.Worker.restartPolicy=OnFailure: a gang has one set of failure rules, "
        "'restart-gang: 1-255' (trainhook.dev/failure-rules), so their exits 1-127 restart the gang too, where "
        "Kubeflow fails the job; edit the annotation in the output to choose (docs/use/gang-lifecycle.md#failure-rules)"]


@pytest.mark.parametrize("restart, rules, exit_3, sigkill", [
    # Kubeflow's ExitCode: 128 and above retried, 1-127 permanent; the default rules (lost peers, timeouts too).
    ("ExitCode", None, "fail-gang", "restart-gang"),
    # OnFailure and Always: Kubeflow restarts the member whatever its exit code; the gang restarts whole.
    ("OnFailure", "restart-gang: 1-255", "restart-gang", "restart-gang"),
    ("Always", "restart-gang: 1-255", "restart-gang", "restart-gang"),
])
def test_the_restart_policy_becomes_the_failure_rules_the_launcher_decides_with(restart, rules, exit_3, sigkill):
    """Through the real admission (explain: the webhook's mutation of every pod) to the variable the coordinator
    reads its rules from, decided as the launcher decides (trainhook/gang/failure_rules.py)."""
    converted = convert_job(retrying(restart=restart, runPolicy={"backoffLimit": 4}), workload_kind="job")
    assert (lifecycle(converted), failure_rules(converted)) == (("restart-gang", "4"), rules)
    assert converted.warnings == []  # what Kubeflow retries, the gang retries: nothing to say
    explained = explain_text(yaml.safe_dump_all(converted.objects))
    assert explained.pods
    for item in explained.pods:
        env = dict(item.injected)
        assert env[keys.TH_ON_FAILURE] == "restart-gang" and env.get(keys.TH_FAILURE_RULES) == rules
        decide = FailureRules.from_text(env.get(keys.TH_FAILURE_RULES)).decide
        assert (decide(3).action, decide(128 + signal.SIGKILL).action) == (exit_3, sigkill)


def test_mpi_operators_launcher_job_retries_whatever_its_restart_policy():
    source = job("MPIJob", "kubeflow.org/v2beta1", runPolicy={"backoffLimit": 2})  # every type restartPolicy Never
    converted = convert_job(source, workload_kind="job")
    assert lifecycle(converted) == ("restart-gang", "2")
    assert all(w["spec"]["backoffLimit"] == 0 for w in workloads(converted))
    assert failure_rules(converted) == "restart-gang: 1-255"
    assert any("spec.mpiReplicaSpecs.Launcher.restartPolicy=Never: mpi-operator's launcher Job reruns a failed "
               "launcher on any exit code, and so does the gang, restarting every member together "
               "(trainhook.dev/failure-rules: 'restart-gang: 1-255')" in w for w in converted.warnings), \
        converted.warnings
