"""check_scale: which in-place size changes of a gang's workload are allowed (issue 18), on workloads as the API
server stores them, i.e. already mutated by the webhook (the shape stamped on the template)."""

from __future__ import annotations

import copy

import pytest

from trainhook.webhook.admission.mutate import mutate
from trainhook.webhook.admission.scale import check_scale
from trainhook.webhook.settings import Settings
from objects import indexed_job, statefulset

SETTINGS = Settings(launcher_image="registry.example/launcher:1", wait_timeout=300)


def stored(obj: dict) -> dict:
    """The object as the API server keeps it: through the real mutation."""
    return mutate(obj["kind"], "CREATE", obj, "team-a", SETTINGS).obj


DDP = stored(statefulset("ddp", 3))
ELASTIC = stored(statefulset("el", 3, annotations={"trainhook.dev/elastic": "2:4"}))


def at(sts: dict, replicas: int) -> dict:
    sts = copy.deepcopy(sts)
    sts["spec"]["replicas"] = replicas
    return sts


def test_a_fixed_gang_cannot_change_size_and_the_message_names_the_key_the_value_and_both_fixes():
    message = check_scale(DDP, 4)
    assert message == (
        "StatefulSet team-a/ddp is a 3-member pytorch gang (trainhook.dev/replicas='worker=3'); kubectl scale "
        "cannot change a running gang's size (spec.replicas 3 -> 4): change spec.replicas with kubectl apply "
        "(the gang restarts with the new shape) or make it elastic with trainhook.dev/elastic: min:max")
    assert check_scale(DDP, 2) is not None and "(spec.replicas 3 -> 2)" in check_scale(DDP, 2)


@pytest.mark.parametrize("workload,new", [
    (DDP, 3),            # no change (kubectl scale to the same size)
    (DDP, 0),            # the launcher scales a finished gang to zero
    (at(DDP, 0), 3),     # rerunning a finished gang: back to the stamped size
    (ELASTIC, 2), (ELASTIC, 4), (ELASTIC, 0), (at(ELASTIC, 0), 2),
])
def test_allowed(workload, new):
    assert check_scale(workload, new) is None


def test_a_stopped_gang_comes_back_only_at_the_size_its_template_was_wired_for():
    message = check_scale(at(DDP, 0), 5)
    assert message is not None and "3-member" in message and "(spec.replicas 0 -> 5)" in message


@pytest.mark.parametrize("new,whole", [(5, 5), (1, 1)])
def test_an_elastic_gang_outside_its_range_is_refused_naming_the_annotation(new, whole):
    message = check_scale(ELASTIC, new)
    assert message == (
        f"StatefulSet team-a/el is an elastic pytorch gang of 2 to 4 members (trainhook.dev/elastic='2:4'); "
        f"spec.replicas={new} would make it {whole}: scale within 2..4, or widen trainhook.dev/elastic with "
        f"kubectl apply")


def test_a_malformed_elastic_range_is_named():
    sts = copy.deepcopy(ELASTIC)
    sts["spec"]["template"]["metadata"]["annotations"]["trainhook.dev/elastic"] = "4:2"
    assert "trainhook.dev/elastic='4:2' is not an elastic range" in check_scale(sts, 4)


def test_elastic_is_pytorch_only():
    sts = stored(statefulset("tf", 2, labels={"trainhook.dev/framework": "xgboost"},
                             annotations={"trainhook.dev/elastic": "1:4"}))
    assert "2-member xgboost gang" in check_scale(sts, 3)


def test_not_a_gang_is_always_allowed():
    plain = statefulset("web", 3)
    del plain["metadata"]["labels"]["trainhook.dev/framework"]
    del plain["spec"]["template"]["metadata"]["labels"]["trainhook.dev/framework"]
    assert check_scale(plain, 7) is None


def test_a_template_only_label_is_still_a_gang():
    sts = copy.deepcopy(DDP)
    del sts["metadata"]["labels"]["trainhook.dev/framework"]
    assert check_scale(sts, 4) is not None


def test_a_multi_role_elastic_gang_counts_its_other_roles():
    workers = stored(statefulset("big-worker", 2, labels={"trainhook.dev/job-name": "big",
                                                          "trainhook.dev/role": "worker"},
                                 annotations={"trainhook.dev/replicas": "master=1,worker=2",
                                              "trainhook.dev/elastic": "2:4"}, service="big"))
    assert check_scale(workers, 3) is None  # 1 master + 3 workers = 4
    assert "would make it 5: scale within 1..3" in check_scale(workers, 4)


def test_a_jobs_parallelism_of_a_fixed_gang_is_refused_with_the_jobs_own_fix():
    job = stored(indexed_job("ij", 3))
    message = check_scale(job, 2)
    assert message.startswith("Job team-a/ij is a 3-member pytorch gang (trainhook.dev/replicas='worker=3'); ")
    assert "(spec.parallelism 3 -> 2)" in message and "delete the Job and create it again" in message
    assert check_scale(job, 0) is None and check_scale(job, 3) is None
