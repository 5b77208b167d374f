"""Table-driven TensorFlow mutation tests: whole input objects and whole expected objects, then the refusals."""

from __future__ import annotations

import copy
import json

import pytest

from trainhook.webhook.admission.member import Denied
from trainhook.webhook.admission.mutate import mutate
from trainhook.webhook.settings import Settings
from expected import stamped, wired
from expected import gang_env as any_gang_env
from objects import bare_pod, container, indexed_job, pod_of_job, pod_of_statefulset, statefulset

SETTINGS = Settings(launcher_image="registry.example/launcher:1", wait_timeout=300)
TF = {"trainhook.dev/framework": "tensorflow"}
PS_GANG = "chief=1,ps=2,worker=2"


def gang_env(*args, **kwargs) -> dict:
    return any_gang_env("tensorflow", *args, **kwargs)


def tf_config(cluster: dict[str, list[str]], role: str, index: int) -> str:
    """TF_CONFIG written out as Kubeflow serializes it (see test_tensorflow_kubeflow.py for the field checks)."""
    return json.dumps({"cluster": cluster, "task": {"type": role, "index": index}, "environment": "cloud"},
                      separators=(",", ":"))


def role_job(role: str, count: int, job: str = "mnist", replicas: str = PS_GANG, **kwargs) -> dict:
    """One Indexed Job of a multi-role gang, as a user writes it: `<job>-<role>`, the whole shape annotated."""
    return indexed_job(f"{job}-{role}", count,
                       labels={**TF, "trainhook.dev/job-name": job, "trainhook.dev/role": role},
                       annotations={"trainhook.dev/replicas": replicas}, **kwargs)


def role_sts(role: str, count: int, job: str = "mnist", replicas: str = PS_GANG) -> dict:
    return statefulset(f"{job}-{role}", count,
                       labels={**TF, "trainhook.dev/job-name": job, "trainhook.dev/role": role},
                       annotations={"trainhook.dev/replicas": replicas}, service=job)


def job_pod(role: str, count: int, index: int, **kwargs) -> dict:
    return pod_of_job(stamped(role_job(role, count, **kwargs), PS_GANG, role, "mnist", "mnist"), index)


def sts_pod(role: str, count: int, index: int) -> dict:
    return pod_of_statefulset(stamped(role_sts(role, count), PS_GANG, role, "mnist"), index)


MNIST_CLUSTER = {"chief": ["mnist-chief-0.mnist:2222"],
                 "ps": ["mnist-ps-0.mnist:2222", "mnist-ps-1.mnist:2222"],
                 "worker": ["mnist-worker-0.mnist:2222", "mnist-worker-1.mnist:2222"]}
MNIST_HOSTS = "chief=mnist-chief,ps=mnist-ps,worker=mnist-worker"

SINGLE = statefulset("tf", 2, labels=TF)
SINGLE_STAMPED = stamped(SINGLE, "worker=2")
SOLO = stamped(statefulset("solo", 1, labels=TF), "worker=1")
EVAL_GANG = "chief=1,worker=2,evaluator=1"
CUSTOM_PORT = stamped(statefulset("tf", 2, labels=TF), "worker=2")
CUSTOM_PORT["spec"]["template"]["metadata"]["annotations"]["trainhook.dev/port"] = "3333"
USER_TF_CONFIG = [{"name": "TF_CONFIG", "value": "{}"}]
USER_ENV = stamped(statefulset("mine", 2, labels=TF, containers=[container(env=USER_TF_CONFIG)]), "worker=2")
BARE = bare_pod("tfb", {**TF, "trainhook.dev/job-name": "tfb", "trainhook.dev/role": "ps",
                        "trainhook.dev/index": "0"}, {"trainhook.dev/replicas": "ps=1,worker=1"})


def eval_pod() -> dict:
    job = role_job("evaluator", 1, replicas=EVAL_GANG)
    return pod_of_job(stamped(job, EVAL_GANG, "evaluator", "mnist", "mnist"), 0)


CASES = [
    ("a single StatefulSet of workers is stamped and made Parallel", "StatefulSet", SINGLE,
     {**SINGLE_STAMPED, "spec": {**SINGLE_STAMPED["spec"], "podManagementPolicy": "Parallel"}}),
    ("a single StatefulSet's pod gets TF_CONFIG listing every worker", "Pod", pod_of_statefulset(SINGLE_STAMPED, 1),
     wired(pod_of_statefulset(SINGLE_STAMPED, 1),
           {"TF_CONFIG": tf_config({"worker": ["tf-0.tf:2222", "tf-1.tf:2222"]}, "worker", 1)},
           gang_env("tf", "worker", 1, 1, "worker=2", "worker=tf", "tf", "tf-1.tf"))),
    ("a one-pod gang gets no TF_CONFIG, as a one-replica TFJob gets none", "Pod", pod_of_statefulset(SOLO, 0),
     wired(pod_of_statefulset(SOLO, 0), {},
           gang_env("solo", "worker", 0, 0, "worker=1", "worker=solo", "solo", "solo-0.solo"))),
    ("a multi-role gang's Job is stamped with its role and given the shared subdomain", "Job",
     role_job("chief", 1), stamped(role_job("chief", 1), PS_GANG, "chief", "mnist", "mnist")),
    ("a multi-role gang's StatefulSet is stamped with its role", "StatefulSet", role_sts("ps", 2),
     {**stamped(role_sts("ps", 2), PS_GANG, "ps", "mnist"),
      "spec": {**stamped(role_sts("ps", 2), PS_GANG, "ps", "mnist")["spec"], "podManagementPolicy": "Parallel"}}),
    ("the chief's pod is task chief 0 of the whole cluster, rank 0", "Pod", job_pod("chief", 1, 0),
     wired(job_pod("chief", 1, 0), {"TF_CONFIG": tf_config(MNIST_CLUSTER, "chief", 0)},
           gang_env("mnist", "chief", 0, 0, PS_GANG, MNIST_HOSTS, "mnist", "mnist-chief-0.mnist"),
           hostname="mnist-chief-0", subdomain="mnist")),
    ("a parameter server's pod is task ps 1, ranked after the chief", "Pod", job_pod("ps", 2, 1),
     wired(job_pod("ps", 2, 1), {"TF_CONFIG": tf_config(MNIST_CLUSTER, "ps", 1)},
           gang_env("mnist", "ps", 1, 2, PS_GANG, MNIST_HOSTS, "mnist", "mnist-ps-1.mnist"),
           hostname="mnist-ps-1", subdomain="mnist")),
    ("a worker StatefulSet's pod in the same gang is task worker 0", "Pod", sts_pod("worker", 2, 0),
     wired(sts_pod("worker", 2, 0), {"TF_CONFIG": tf_config(MNIST_CLUSTER, "worker", 0)},
           gang_env("mnist", "worker", 0, 3, PS_GANG, MNIST_HOSTS, "mnist", "mnist-worker-0.mnist"))),
    ("the evaluator is listed in the cluster, as Kubeflow lists it", "Pod", eval_pod(),
     wired(eval_pod(), {"TF_CONFIG": tf_config(
         {"chief": ["mnist-chief-0.mnist:2222"], "evaluator": ["mnist-evaluator-0.mnist:2222"],
          "worker": ["mnist-worker-0.mnist:2222", "mnist-worker-1.mnist:2222"]}, "evaluator", 0)},
         gang_env("mnist", "evaluator", 0, 3, EVAL_GANG, "chief=mnist-chief,worker=mnist-worker,"
                  "evaluator=mnist-evaluator", "mnist", "mnist-evaluator-0.mnist"),
         hostname="mnist-evaluator-0", subdomain="mnist")),
    ("a bare pod gets its address and a TF_CONFIG", "Pod", BARE,
     wired(BARE, {"TF_CONFIG": tf_config({"ps": ["tfb-ps-0.tfb:2222"], "worker": ["tfb-worker-0.tfb:2222"]},
                                         "ps", 0)},
           gang_env("tfb", "ps", 0, 0, "ps=1,worker=1", "ps=tfb-ps,worker=tfb-worker", "tfb", "tfb-ps-0.tfb"),
           hostname="tfb-ps-0", subdomain="tfb")),
    ("the port annotation is every task's port", "Pod", pod_of_statefulset(CUSTOM_PORT, 0),
     wired(pod_of_statefulset(CUSTOM_PORT, 0),
           {"TF_CONFIG": tf_config({"worker": ["tf-0.tf:3333", "tf-1.tf:3333"]}, "worker", 0)},
           gang_env("tf", "worker", 0, 0, "worker=2", "worker=tf", "tf", "tf-0.tf", port="3333"))),
    ("the user's own TF_CONFIG is kept and comes after the injected variables", "Pod",
     pod_of_statefulset(USER_ENV, 0),
     wired(pod_of_statefulset(USER_ENV, 0), {},
           gang_env("mine", "worker", 0, 0, "worker=2", "worker=mine", "mine", "mine-0.mine"),
           user_env=USER_TF_CONFIG)),
]


@pytest.mark.parametrize("name,kind,given,expected", CASES, ids=[c[0] for c in CASES])
def test_mutation_yields_the_whole_expected_object(name, kind, given, expected):
    before = copy.deepcopy(given)
    assert mutate(kind, "CREATE", given, "team-a", SETTINGS).obj == expected
    assert given == before, "the input object must not be modified"


@pytest.mark.parametrize("kind,obj", [(c[1], c[2]) for c in CASES], ids=[c[0] for c in CASES])
def test_mutating_twice_equals_mutating_once(kind, obj):
    once = mutate(kind, "CREATE", obj, "team-a", SETTINGS)
    assert mutate(kind, "CREATE", once.obj, "team-a", SETTINGS).obj == once.obj


def test_a_kept_user_tf_config_is_reported_as_a_warning():
    result = mutate("Pod", "CREATE", pod_of_statefulset(USER_ENV, 0), "team-a", SETTINGS)
    assert result.warnings == ["container trainer: kept your TF_CONFIG={}; trainhook would set "
                               + tf_config({"worker": ["mine-0.mine:2222", "mine-1.mine:2222"]}, "worker", 0)]


def test_tf_config_is_valid_json_that_tensorflows_own_parser_reads():
    """TensorFlow's TFConfigClusterResolver is json.loads on the variable: parse it the same way."""
    pod = mutate("Pod", "CREATE", job_pod("ps", 2, 1), "team-a", SETTINGS).obj
    value = next(e["value"] for e in pod["spec"]["containers"][0]["env"] if e["name"] == "TF_CONFIG")
    assert json.loads(value) == {"cluster": MNIST_CLUSTER, "task": {"type": "ps", "index": 1},
                                 "environment": "cloud"}


def refusal(kind: str, obj: dict) -> str:
    with pytest.raises(Denied) as caught:
        mutate(kind, "CREATE", obj, "team-a", SETTINGS)
    return str(caught.value)


def shaped_pod(replicas: str, role: str = "worker") -> dict:
    return bare_pod("p", {**TF, "trainhook.dev/job-name": "p", "trainhook.dev/role": role,
                          "trainhook.dev/index": "0"}, {"trainhook.dev/replicas": replicas})


@pytest.mark.parametrize("kind,obj,expected", [
    ("Pod", shaped_pod("chief=2,worker=2", "chief"),
     ["trainhook.dev/replicas='chief=2,worker=2': TensorFlow allows at most one chief task; "
      "set chief=1 and put the other replicas in the worker role"]),
    ("Pod", shaped_pod("chief=1,master=1,worker=2"),
     ["trainhook.dev/replicas='chief=1,master=1,worker=2': a TensorFlow gang has a chief or a master, not both",
      "keep one of the two roles"]),
    ("Pod", shaped_pod("master=2,worker=1"), ["TensorFlow allows at most one master task"]),
    ("Pod", shaped_pod("worker=2,evaluator=2", "evaluator"), ["TensorFlow allows at most one evaluator task"]),
    ("Pod", shaped_pod("ps=2", "ps"), ["parameter servers with no chief or worker to train; add chief=1"]),
    ("Pod", shaped_pod("chief=1,worker=2", "driver"),
     ["trainhook.dev/role='driver': not a tensorflow role; use one of chief, master, ps, worker, evaluator"]),
    ("Pod", shaped_pod("chief=1,launcher=2"),
     ["trainhook.dev/replicas='chief=1,launcher=2': 'launcher' is not a tensorflow role"]),
    ("Job", role_job("worker", 3),
     ["trainhook.dev/replicas='chief=1,ps=2,worker=2': says worker=2 but spec.completions is 3; make them agree"]),
    ("StatefulSet", role_sts("ps", 1),
     ["trainhook.dev/replicas='chief=1,ps=2,worker=2': says ps=2 but spec.replicas is 1"]),
    ("Job", {**role_job("worker", 2), "metadata": {**role_job("worker", 2)["metadata"], "name": "workers"}},
     ["metadata.name='workers': a multi-role gang's workloads are named <job-name>-<role>; name it mnist-worker"]),
    ("StatefulSet", {**role_sts("ps", 2), "spec": {**role_sts("ps", 2)["spec"], "serviceName": "mnist-ps"}},
     ["spec.serviceName='mnist-ps': a multi-role gang shares one Service <job-name>; set it to mnist"]),
])
def test_refusals_name_the_key_the_value_and_the_fix(kind, obj, expected):
    before = copy.deepcopy(obj)
    message = refusal(kind, obj)
    for fragment in expected:
        assert fragment in message
    assert obj == before


def test_every_shape_problem_comes_in_one_answer():
    message = refusal("Pod", shaped_pod("chief=2,master=2,worker=1,evaluator=3"))
    for fragment in ("chief or a master, not both", "at most one chief", "at most one master",
                     "at most one evaluator"):
        assert fragment in message


# --- A multi-role gang labeled on its pod templates only -------------------------------------------------------
# Many users write the job name and role only on the templates (templates are what select and make the pods), and
# the framework alone on the workloads. Either place must work, as it does for annotations.
TFJOB_GANG = "chief=1,ps=1,worker=2"
TFJOB_CLUSTER = {"chief": ["tfjob-chief-0.tfjob:2222"], "ps": ["tfjob-ps-0.tfjob:2222"],
                 "worker": ["tfjob-worker-0.tfjob:2222", "tfjob-worker-1.tfjob:2222"]}
TFJOB_HOSTS = "chief=tfjob-chief,ps=tfjob-ps,worker=tfjob-worker"
TFJOB_MEMBERS = [("chief", 1), ("ps", 1), ("worker", 2)]


def on_template(workload: dict, role: str, job: str = "tfjob", replicas: str = TFJOB_GANG) -> dict:
    """`workload` with the job name, role and shape written on its pod template only."""
    meta = workload["spec"]["template"]["metadata"]
    meta["labels"].update({"trainhook.dev/job-name": job, "trainhook.dev/role": role})
    meta["annotations"] = {"trainhook.dev/replicas": replicas}
    return workload


def template_labeled_sts(role: str, count: int) -> dict:
    return on_template(statefulset(f"tfjob-{role}", count, labels=TF, service="tfjob"), role)


def template_labeled_job(role: str, count: int) -> dict:
    return on_template(indexed_job(f"tfjob-{role}", count, labels=TF), role)


def admitted(workload: dict, **spec: object) -> dict:
    """The workload as the webhook returns it: the template already says everything its pods need, so only the
    spec changes (a StatefulSet's pod management, a Job's subdomain)."""
    workload = copy.deepcopy(workload)
    workload["spec"].update(spec)
    if workload["kind"] == "Job":
        workload["spec"]["template"]["spec"]["subdomain"] = "tfjob"
    return workload


@pytest.mark.parametrize("role,count", TFJOB_MEMBERS)
def test_a_template_labeled_statefulset_of_a_multi_role_gang_is_admitted(role, count):
    given = template_labeled_sts(role, count)
    before = copy.deepcopy(given)
    result = mutate("StatefulSet", "CREATE", given, "team-a", SETTINGS).obj
    assert result == admitted(given, podManagementPolicy="Parallel")
    assert given == before
    assert mutate("StatefulSet", "CREATE", result, "team-a", SETTINGS).obj == result
    assert mutate("StatefulSet", "UPDATE", result, "team-a", SETTINGS).obj == result


@pytest.mark.parametrize("role,count", TFJOB_MEMBERS)
def test_a_template_labeled_indexed_job_of_a_multi_role_gang_is_admitted(role, count):
    given = template_labeled_job(role, count)
    result = mutate("Job", "CREATE", given, "team-a", SETTINGS).obj
    assert result == admitted(given)
    assert mutate("Job", "CREATE", result, "team-a", SETTINGS).obj == result


# (role, count, index, rank) of every pod: ranks run through the roles in rank order, chief first.
TFJOB_PODS = [("chief", 1, 0, 0), ("ps", 1, 0, 1), ("worker", 2, 0, 2), ("worker", 2, 1, 3)]


@pytest.mark.parametrize("kind", ["StatefulSet", "Job"])
@pytest.mark.parametrize("role,count,index,rank", TFJOB_PODS)
def test_the_pods_of_a_template_labeled_gang_get_the_whole_tf_config(kind, role, count, index, rank):
    build, pod_of = ((template_labeled_sts, pod_of_statefulset) if kind == "StatefulSet"
                     else (template_labeled_job, pod_of_job))
    workload = mutate(kind, "CREATE", build(role, count), "team-a", SETTINGS).obj
    pod = pod_of(workload, index)
    address = {} if kind == "StatefulSet" else {"hostname": f"tfjob-{role}-{index}", "subdomain": "tfjob"}
    assert mutate("Pod", "CREATE", pod, "team-a", SETTINGS).obj == wired(
        pod, {"TF_CONFIG": tf_config(TFJOB_CLUSTER, role, index)},
        gang_env("tfjob", role, index, rank, TFJOB_GANG, TFJOB_HOSTS, "tfjob", f"tfjob-{role}-{index}.tfjob"),
        **address)


@pytest.mark.parametrize("kind,workload", [("StatefulSet", statefulset), ("Job", indexed_job)])
def test_a_label_on_both_the_workload_and_its_template_must_agree(kind, workload):
    obj = workload("tfjob-ps", 1, labels={**TF, "trainhook.dev/role": "ps"},
                   **({"service": "tfjob"} if kind == "StatefulSet" else {}))
    on_template(obj, "worker")
    message = refusal(kind, obj)
    assert (f"trainhook.dev/role='ps': the {kind}'s label says 'ps' but its pod template's says 'worker'; "
            "make the two agree, or write the label in one place only") in message
    assert "name it" not in message, "one refusal, for the conflict, not its consequences"
