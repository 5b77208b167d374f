"""Labeled objects that cannot work are denied with every problem, each naming the key, the value and the fix."""

from __future__ import annotations

import copy

import pytest

from trainhook.webhook.admission.member import Denied
from trainhook.webhook.admission.mutate import mutate
from trainhook.webhook.settings import Settings
from objects import bare_pod, indexed_job, pod_of_statefulset, service, statefulset

SETTINGS = Settings()


def denial(kind: str, obj: dict, operation: str = "CREATE") -> str:
    with pytest.raises(Denied) as caught:
        mutate(kind, operation, obj, "team-a", SETTINGS)
    return str(caught.value)


def stamped_pod(**annotations: str) -> dict:
    sts = mutate("StatefulSet", "CREATE", statefulset("ddp", 2), "team-a", SETTINGS).obj
    sts["spec"]["template"]["metadata"]["annotations"].update(annotations)
    return pod_of_statefulset(sts, 0)


def on_template(workload: dict, **labels: str) -> dict:
    """`workload` with `labels` (`job_name` for trainhook.dev/job-name) written on its pod template only."""
    workload["spec"]["template"]["metadata"]["labels"].update(
        {f"trainhook.dev/{key.replace('_', '-')}": value for key, value in labels.items()})
    return workload


@pytest.mark.parametrize("kind,obj,expected", [
    # The identity labels may be on the workload or its template; where both are, they must agree.
    ("StatefulSet", on_template(statefulset("a-worker", 2, labels={"trainhook.dev/job-name": "a"}), job_name="b"),
     ["trainhook.dev/job-name='a': the StatefulSet's label says 'a' but its pod template's says 'b'; "
      "make the two agree, or write the label in one place only"]),
    ("Job", on_template(indexed_job("j", 2), framework="tensorflow"),
     ["trainhook.dev/framework='pytorch': the Job's label says 'pytorch' but its pod template's says 'tensorflow'"]),
    ("StatefulSet", on_template(statefulset("x", 2), role="boss"),
     ["trainhook.dev/role='boss': not a pytorch role; use one of master, worker"]),
    ("StatefulSet", statefulset("x", 2, labels={"trainhook.dev/framework": "tensorfow"}),
     ["trainhook.dev/framework='tensorfow': unknown framework; use one of pytorch, tensorflow"]),
    ("StatefulSet", statefulset("x", 2, labels={"trainhook.dev/role": "chief"}),
     ["trainhook.dev/role='chief': not a pytorch role; use one of master, worker"]),
    ("StatefulSet", statefulset("x", 2, service=""),
     ["spec.serviceName='': peers resolve each other through it; set it to the headless Service's name"]),
    ("StatefulSet", statefulset("x-worker", 2, labels={"trainhook.dev/job-name": "x"},
                                annotations={"trainhook.dev/replicas": "master=1,worker=x"}),
     ["trainhook.dev/replicas='master=1,worker=x': cannot parse 'worker=x'; write role=count pairs"]),
    ("StatefulSet", statefulset("x-worker", 2, labels={"trainhook.dev/job-name": "x"},
                                annotations={"trainhook.dev/replicas": "master=1,worker=3"}, service="x"),
     ["trainhook.dev/replicas='master=1,worker=3': says worker=3 but spec.replicas is 2; make them agree"]),
    ("StatefulSet", statefulset("wrong", 3, labels={"trainhook.dev/job-name": "x"},
                                annotations={"trainhook.dev/replicas": "master=1,worker=3"}, service="x"),
     ["metadata.name='wrong': a multi-role gang's workloads are named <job-name>-<role>; name it x-worker"]),
    ("Pod", bare_pod("p", {"trainhook.dev/job-name": "p"}, {"trainhook.dev/replicas": "worker=2"}),
     ["trainhook.dev/index=None: a bare Pod needs its index within its role; set the label trainhook.dev/index"]),
    ("Pod", bare_pod("p", {"trainhook.dev/index": "0"}, {}),
     ["trainhook.dev/job-name=None: a bare Pod must name its gang",
      "trainhook.dev/replicas=None: the pod does not say its gang's shape; set the annotation"]),
    ("Pod", bare_pod("p", {"trainhook.dev/job-name": "p", "trainhook.dev/index": "5"},
                     {"trainhook.dev/replicas": "worker=2"}),
     ["index 5 of role worker is outside the gang; make worker=6 or more"]),
    ("Pod", stamped_pod(**{"trainhook.dev/container": "trainr"}),
     ["trainhook.dev/container='trainr': no container has that name (containers: trainer)"]),
    ("Pod", stamped_pod(**{"trainhook.dev/nproc-per-node": "many", "trainhook.dev/elastic": "4:2",
                           "trainhook.dev/port": "70000", "trainhook.dev/gang-wait": "ping"}),
     ["trainhook.dev/port='70000': not a TCP port", "trainhook.dev/gang-wait='ping': unknown gang-wait mode",
      "trainhook.dev/nproc-per-node='many': not a process count",
      "trainhook.dev/elastic='4:2': not an elastic range"]),
    ("Pod", bare_pod("p", {"trainhook.dev/job-name": "p", "trainhook.dev/index": "0"},
                     {"trainhook.dev/replicas": "master=2,worker=1"}),
     ["a PyTorch gang has at most one master"]),
    ("StatefulSet", statefulset("p-master", 2, labels={"trainhook.dev/job-name": "p", "trainhook.dev/role": "master"},
                                annotations={"trainhook.dev/replicas": "master=2,worker=1"}, service="p"),
     ["a PyTorch gang has at most one master; set master=1"]),
    ("StatefulSet", statefulset("lc", 2, annotations={"trainhook.dev/on-failure": "retry",
                                                      "trainhook.dev/max-restarts": "-1",
                                                      "trainhook.dev/active-deadline-seconds": "0"}),
     ["trainhook.dev/on-failure='retry': unknown failure policy; use fail-gang or restart-gang",
      "trainhook.dev/max-restarts='-1': not a restart count", "trainhook.dev/active-deadline-seconds='0'"]),
    ("Job", {**indexed_job("j", 4), "spec": {**indexed_job("j", 4)["spec"], "parallelism": 1}},
     ["spec.parallelism=1: only 1 of 4 pods would run at once and the gang never forms; set spec.parallelism: 4"]),
    ("Service", service("s", type="NodePort"), ["spec.type='NodePort': pod hostnames resolve only through"]),
    ("Service", service("s", clusterIP="10.0.0.7"), ["spec.clusterIP='10.0.0.7'", "drop spec.clusterIP"]),
])
def test_refusals_name_the_key_the_value_and_the_fix(kind, obj, expected):
    before = copy.deepcopy(obj)
    message = denial(kind, obj)
    for fragment in expected:
        assert fragment in message
    assert obj == before


def test_all_problems_come_in_one_answer():
    sts = statefulset("x", 2, labels={"trainhook.dev/framework": "pytorch", "trainhook.dev/role": "boss"},
                      service="")
    with pytest.raises(Denied) as caught:
        mutate("StatefulSet", "CREATE", sts, "team-a", SETTINGS)
    assert len(caught.value.problems) == 2


def test_an_existing_cluster_ip_service_cannot_be_updated_into_a_gang():
    message = denial("Service", service("s", clusterIP="10.0.0.7"), operation="UPDATE")
    assert "delete and recreate the Service headless" in message


def test_a_kept_false_publish_not_ready_addresses_warns():
    result = mutate("Service", "CREATE", service("s", publishNotReadyAddresses=False), "team-a", SETTINGS)
    assert result.obj["spec"]["publishNotReadyAddresses"] is False
    assert "publishNotReadyAddresses" in result.warnings[0]


@pytest.mark.parametrize("kind,obj,expected", [
    # The fuzzer's find: a TensorFlow pod claiming billions of peers made the review build a TF_CONFIG listing
    # them all, until the process ran out of memory.
    ("Pod", bare_pod("tf-worker-0", {"trainhook.dev/framework": "tensorflow", "trainhook.dev/role": "worker",
                                     "trainhook.dev/job-name": "tf", "trainhook.dev/index": "0"},
                     {"trainhook.dev/replicas": "chief=3333333331,ps=1,worker=2"}),
     "trainhook.dev/replicas='chief=3333333331,ps=1,worker=2': a gang of 3333333334 pods is more than trainhook "
     "admits (10000); use at most 10000 pods in one gang"),
    ("StatefulSet", statefulset("big", 10_001, labels={"trainhook.dev/framework": "xgboost"}),
     "spec.replicas=10001: a gang of 10001 pods is more than trainhook admits (10000)"),
    ("Job", indexed_job("big", 20_000), "spec.completions=20000: a gang of 20000 pods is more than trainhook"),
])
def test_a_gang_beyond_the_size_limit_is_refused_before_its_members_are_listed(kind, obj, expected):
    assert expected in denial(kind, obj)


def test_a_tf_config_gang_at_its_size_limit_is_admitted_with_every_member_and_one_more_is_refused():
    """TF_CONFIG lists every member in every pod (O(N^2) per gang): 1,000 members is the limit (issue 32), admitted
    with the whole list; one more is refused naming the reason. Other frameworks keep the shape's 10,000."""
    import json

    def tf_pod(workers: int) -> dict:
        return bare_pod("tf-worker-0", {"trainhook.dev/framework": "tensorflow", "trainhook.dev/role": "worker",
                                        "trainhook.dev/job-name": "tf", "trainhook.dev/index": "0"},
                        {"trainhook.dev/replicas": f"chief=1,worker={workers}"})
    env = mutate("Pod", "CREATE", tf_pod(999), "team-a", SETTINGS).obj["spec"]["containers"][0]["env"]
    config = json.loads(next(e["value"] for e in env if e["name"] == "TF_CONFIG"))
    assert len(config["cluster"]["worker"]) == 999 and config["cluster"]["worker"][-1] == "tf-worker-998.tf:2222"
    assert "trainhook refuses TF_CONFIG gangs above 1000 members" in denial("Pod", tf_pod(1000))
    pytorch = bare_pod("pt-0", {"trainhook.dev/job-name": "pt", "trainhook.dev/index": "0"},
                       {"trainhook.dev/replicas": "worker=10000"})
    assert mutate("Pod", "CREATE", pytorch, "team-a", SETTINGS).obj["spec"]["containers"][0]["env"]
