"""Gang schedulers: the labels, annotations and scheduler names each one reads, set on the gang's pods."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest

from trainhook.webhook.admission.member import Denied
from trainhook.webhook.admission.mutate import mutate
from trainhook.webhook.settings import Settings
from objects import pod_of_statefulset, statefulset

SETTINGS = Settings()


def gang_pod(annotations: dict, replicas: int = 4, ordinal: int = 1, **spec) -> dict:
    sts = mutate("StatefulSet", "CREATE", statefulset("g", replicas, annotations=annotations), "team-a",
                 SETTINGS).obj
    pod = pod_of_statefulset(sts, ordinal)
    pod["spec"].update(spec)
    return pod


def scheduling_view(pod: dict) -> dict:
    """Only what schedulers read: foreign labels/annotations, schedulerName, priorityClassName."""
    meta, spec = pod["metadata"], pod["spec"]
    foreign = ("kueue.x-k8s.io/", "scheduling.k8s.io/", "volcano.sh/", "scheduling.x-k8s.io/")
    return {
        "labels": {k: v for k, v in meta.get("labels", {}).items() if k.startswith(foreign)},
        "annotations": {k: v for k, v in meta.get("annotations", {}).items() if k.startswith(foreign)},
        "schedulerName": spec.get("schedulerName"), "priorityClassName": spec.get("priorityClassName"),
    }


CASES = [
    ("kueue", {"trainhook.dev/gang-scheduler": "kueue", "trainhook.dev/queue": "team-queue"},
     {"labels": {"kueue.x-k8s.io/queue-name": "team-queue", "kueue.x-k8s.io/pod-group-name": "g"},
      "annotations": {"kueue.x-k8s.io/pod-group-total-count": "4"}, "schedulerName": None,
      "priorityClassName": None}),
    ("volcano", {"trainhook.dev/gang-scheduler": "volcano", "trainhook.dev/queue": "research",
                 "trainhook.dev/priority-class": "high"},
     {"labels": {}, "annotations": {"scheduling.k8s.io/group-name": "g", "volcano.sh/queue-name": "research"},
      "schedulerName": "volcano", "priorityClassName": "high"}),
    ("coscheduling", {"trainhook.dev/gang-scheduler": "coscheduling"},
     {"labels": {"scheduling.x-k8s.io/pod-group": "g"}, "annotations": {},
      "schedulerName": "scheduler-plugins-scheduler", "priorityClassName": None}),
    ("coscheduling with its own scheduler name", {"trainhook.dev/gang-scheduler": "coscheduling",
                                                  "trainhook.dev/scheduler-name": "gang-sched"},
     {"labels": {"scheduling.x-k8s.io/pod-group": "g"}, "annotations": {}, "schedulerName": "gang-sched",
      "priorityClassName": None}),
    ("no scheduler, a priority class", {"trainhook.dev/priority-class": "low"},
     {"labels": {}, "annotations": {}, "schedulerName": None, "priorityClassName": "low"}),
]


@pytest.mark.parametrize("name,annotations,expected", CASES, ids=[c[0] for c in CASES])
def test_each_scheduler_gets_what_it_reads(name, annotations, expected):
    pod = mutate("Pod", "CREATE", gang_pod(annotations), "team-a", SETTINGS).obj
    assert scheduling_view(pod) == expected
    kubernetes_validate.validate(pod, "1.33.0", strict=True)
    assert mutate("Pod", "CREATE", pod, "team-a", SETTINGS).obj == pod


@pytest.mark.parametrize("annotations,spec,fragment", [
    ({"trainhook.dev/gang-scheduler": "yunikorn"}, {}, "trainhook.dev/gang-scheduler='yunikorn': unknown gang"),
    ({"trainhook.dev/gang-scheduler": "kueue"}, {}, "trainhook.dev/queue=None: Kueue admits pods through"),
    ({"trainhook.dev/gang-scheduler": "volcano", "trainhook.dev/min-available": "9"}, {},
     "trainhook.dev/min-available='9': not a pod count from 1 to the gang's 4"),
    ({"trainhook.dev/gang-scheduler": "volcano"}, {"schedulerName": "other"},
     "spec.schedulerName='other': the gang scheduler needs volcano"),
])
def test_scheduler_settings_that_cannot_work_are_refused(annotations, spec, fragment):
    with pytest.raises(Denied) as caught:
        mutate("Pod", "CREATE", gang_pod(annotations, **spec), "team-a", SETTINGS)
    assert fragment in str(caught.value)


def test_kueue_warns_that_min_available_is_not_partial():
    result = mutate("Pod", "CREATE", gang_pod({"trainhook.dev/gang-scheduler": "kueue", "trainhook.dev/queue": "q",
                                              "trainhook.dev/min-available": "2"}), "team-a", SETTINGS)
    assert result.warnings == ["trainhook.dev/min-available=2: Kueue admits a pod group whole, all 4 pods"]


def test_a_users_priority_class_is_kept():
    pod = gang_pod({"trainhook.dev/priority-class": "high"}, priorityClassName="mine")
    result = mutate("Pod", "CREATE", pod, "team-a", SETTINGS)
    assert result.obj["spec"]["priorityClassName"] == "mine"
    assert "kept your mine" in result.warnings[0]
    assert copy.deepcopy(result.obj) == mutate("Pod", "CREATE", result.obj, "team-a", SETTINGS).obj


def test_a_workloads_priority_class_goes_on_its_template_for_the_priority_plugin():
    sts = mutate("StatefulSet", "CREATE", statefulset("p", 2, annotations={"trainhook.dev/priority-class": "high"}),
                 "team-a", SETTINGS).obj
    assert sts["spec"]["template"]["spec"]["priorityClassName"] == "high"


def test_a_bare_pod_given_a_class_loses_the_no_class_priority_the_plugin_filled_in():
    from objects import bare_pod
    pod = bare_pod("b", {"trainhook.dev/job-name": "b", "trainhook.dev/index": "0"},
                   {"trainhook.dev/replicas": "worker=1", "trainhook.dev/priority-class": "high"})
    pod["spec"].update(priority=0, preemptionPolicy="PreemptLowerPriority")
    out = mutate("Pod", "CREATE", pod, "team-a", SETTINGS).obj
    assert out["spec"]["priorityClassName"] == "high"
    assert "priority" not in out["spec"] and "preemptionPolicy" not in out["spec"]
