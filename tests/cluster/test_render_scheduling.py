"""Gang scheduling in rendered manifests (issue 10): the annotations the webhook reads, the PodGroup Volcano or
the coscheduling plugin needs (valid under their published CRD schemas), and the examples of
docs/use/scheduling/ checked offline and on a real API server."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from test_cli_cluster import cli, wait_for
from rendered import PODGROUP_CRDS, by_kind, options, validate_objects
from trainhook.gang import keys
from trainhook.cli import main
from trainhook.render.explain import explain_text
from trainhook.render import RenderError, Scheduling, render, to_yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples" / "scheduling").glob("*.yaml"))


def test_volcano_gets_its_podgroup_with_the_gang_size_queue_and_priority():
    objects = render(options(roles=[("worker", 4)], scheduling=Scheduling("volcano", queue="research",
                                                                          priority_class="high")))
    validate_objects(objects)
    sts = by_kind(objects)["StatefulSet"][0]
    assert sts["metadata"]["annotations"] == {keys.GANG_SCHEDULER: "volcano", keys.QUEUE: "research"}
    assert sts["spec"]["template"]["spec"]["priorityClassName"] == "high"
    assert objects[-1] == {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                           "metadata": {"name": "mnist", "labels": {keys.JOB_NAME: "mnist"}},
                           "spec": {"minMember": 4, "queue": "research", "priorityClassName": "high"}}


def test_coscheduling_gets_its_podgroup_with_min_member_and_timeout():
    objects = render(options(roles=[("master", 1), ("worker", 3)], namespace="team-a",
                             scheduling=Scheduling("coscheduling", min_available=3, schedule_timeout_seconds=60,
                                                   scheduler_name="my-scheduler")))
    validate_objects(objects)
    for workload in by_kind(objects)["StatefulSet"]:
        assert workload["metadata"]["annotations"] == {
            keys.GANG_SCHEDULER: "coscheduling", keys.SCHEDULER_NAME: "my-scheduler", keys.MIN_AVAILABLE: "3",
            keys.REPLICAS: "master=1,worker=3"}
    assert objects[-1] == {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
                           "metadata": {"name": "mnist", "namespace": "team-a", "labels": {keys.JOB_NAME: "mnist"}},
                           "spec": {"minMember": 3, "scheduleTimeoutSeconds": 60}}


def test_kueue_needs_no_object_of_ours_only_the_queue():
    objects = render(options(scheduling=Scheduling("kueue", queue="user-queue")))
    validate_objects(objects)
    assert [o["kind"] for o in objects] == ["Service", "StatefulSet"]
    assert objects[1]["metadata"]["annotations"] == {keys.GANG_SCHEDULER: "kueue", keys.QUEUE: "user-queue"}
    # in the template too: Kueue's webhook gates the pods only if it sees the queue label, whatever the order of
    # the two webhooks
    template = objects[1]["spec"]["template"]["metadata"]
    assert template["labels"][keys.KUEUE_QUEUE_NAME] == "user-queue"
    assert template["labels"][keys.KUEUE_POD_GROUP_NAME] == "mnist"
    assert template["annotations"] == {keys.KUEUE_POD_GROUP_TOTAL_COUNT: "2"}


@pytest.mark.parametrize("scheduling, fragment", [
    (Scheduling("kueue"), "--gang-scheduler kueue needs --queue"),
    (Scheduling("volcano", min_available=3), "--min-available 3: give a pod count from 1 to the gang's 2"),
    (Scheduling("volcano", schedule_timeout_seconds=5), "--schedule-timeout-seconds is a coscheduling"),
    (Scheduling("yunikorn"), "--gang-scheduler yunikorn"),
])
def test_scheduling_that_cannot_work_is_refused(scheduling, fragment):
    with pytest.raises(RenderError) as raised:
        render(options(scheduling=scheduling))
    assert fragment in str(raised.value)


def test_podgroups_are_checked_against_the_schedulers_crds():
    import jsonschema

    from rendered import podgroup_schema
    for api_version in PODGROUP_CRDS:
        bad = {"apiVersion": api_version, "kind": "PodGroup", "metadata": {"name": "x"},
               "spec": {"minMember": "four"}}
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, podgroup_schema(api_version))
        unknown = {**bad, "spec": {"minMember": 1, "minMembers": 2}}
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(unknown, podgroup_schema(api_version))


def scheduler_view(pod: dict) -> dict:
    """What each gang scheduler reads on a pod."""
    meta, spec = pod["metadata"], pod["spec"]
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    return {
        "schedulerName": spec.get("schedulerName", "default-scheduler"),
        "priorityClassName": spec.get("priorityClassName"),
        "labels": {k: v for k, v in labels.items() if k.startswith(("kueue.x-k8s.io/", "scheduling.x-k8s.io/"))},
        "annotations": {k: v for k, v in annotations.items()
                        if k.startswith(("kueue.x-k8s.io/", "scheduling.k8s.io/", "volcano.sh/"))},
    }


EXPECTED = {
    "kueue.yaml": {"schedulerName": "default-scheduler", "priorityClassName": "training",
                   "labels": {keys.KUEUE_QUEUE_NAME: "user-queue", keys.KUEUE_POD_GROUP_NAME: "mnist-kueue"},
                   "annotations": {keys.KUEUE_POD_GROUP_TOTAL_COUNT: "4"}},
    "volcano.yaml": {"schedulerName": "volcano", "priorityClassName": "training", "labels": {},
                     "annotations": {keys.VOLCANO_GROUP_NAME: "mnist-volcano", keys.VOLCANO_QUEUE_NAME: "research"}},
    "coscheduling.yaml": {"schedulerName": keys.COSCHEDULING_SCHEDULER, "priorityClassName": None,
                          "labels": {keys.COSCHEDULING_POD_GROUP: "mnist-cosched"}, "annotations": {}},
}


def test_there_is_one_example_per_scheduler():
    assert sorted(p.name for p in EXAMPLES) == sorted(EXPECTED)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_each_example_is_what_its_render_command_prints(example, capsys):
    command = next(line for line in example.read_text().splitlines() if line.startswith("# $ trainhook "))
    assert main(shlex.split(command.removeprefix("# $ trainhook "))) == 0
    rendered = capsys.readouterr().out
    assert example.read_text().split(command + "\n", 1)[1] == rendered
    validate_objects(list(yaml.safe_load_all(rendered)))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_each_examples_pods_carry_what_their_scheduler_reads(example):
    explained = explain_text(example.read_text())
    assert len(explained.pods) == 4
    for item in explained.pods:
        assert scheduler_view(item.pod) == EXPECTED[example.name]


def test_render_to_yaml_round_trips_the_podgroup():
    objects = render(options(scheduling=Scheduling("volcano")))
    assert list(yaml.safe_load_all(to_yaml(objects))) == objects


# --- on a real API server ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def podgroup_crds(control_plane):
    """The schedulers' PodGroup CRDs installed (no scheduler runs: the pods stay Pending, as they should)."""
    from kubernetes import client
    with control_plane.api_client() as api:
        extensions = client.ApiextensionsV1Api(api)
        for path in PODGROUP_CRDS.values():
            crd = yaml.safe_load(path.read_text())
            try:
                extensions.create_custom_resource_definition(crd, _preload_content=False)
            except client.exceptions.ApiException as e:
                if e.status != 409:
                    raise
        for path in PODGROUP_CRDS.values():
            name = yaml.safe_load(path.read_text())["metadata"]["name"]
            wait_for(lambda: any(c.get("type") == "Established" and c.get("status") == "True" for c in
                                 (client.CustomObjectsApi(api).get_cluster_custom_object(
                                     "apiextensions.k8s.io", "v1", "customresourcedefinitions", name)
                                  .get("status") or {}).get("conditions") or []), what=f"CRD {name}")
        scheduling = client.SchedulingV1Api(api)
        try:
            scheduling.create_priority_class({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                              "metadata": {"name": "training"}, "value": 1000},
                                             _preload_content=False)
        except client.exceptions.ApiException as e:
            if e.status != 409:
                raise
    yield


@pytest.mark.cluster
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_each_example_on_a_real_api_server(example, control_plane, k8s_namespace, mutating_webhook,
                                           podgroup_crds, capsys):
    from kubernetes import client
    code, out, err = cli(capsys, "submit", "-f", str(example), "-n", k8s_namespace, "--kubeconfig",
                         str(control_plane.kubeconfig))
    assert code == 0, err
    gang = yaml.safe_load_all(example.read_text())
    names = {f"{o['kind'].lower()}/{o['metadata']['name']}" for o in gang}
    assert {line.removesuffix(" created") for line in out.splitlines()} == names
    gang_name = next(o for o in yaml.safe_load_all(example.read_text()) if o["kind"] == "Service")["metadata"]["name"]
    with control_plane.api_client() as api:
        core = client.CoreV1Api(api)

        def four_pods():
            answer = core.list_namespaced_pod(k8s_namespace, label_selector=f"{keys.JOB_NAME}={gang_name}",
                                              _preload_content=False)
            items = json.loads(answer.data)["items"]
            return items if len(items) == 4 else None

        for pod in wait_for(four_pods, what="4 pods"):
            assert scheduler_view(pod) == EXPECTED[example.name]
        group = next((o for o in yaml.safe_load_all(example.read_text()) if o["kind"] == "PodGroup"), None)
        if group is not None:
            api_group, version = group["apiVersion"].split("/")
            stored = client.CustomObjectsApi(api).get_namespaced_custom_object(
                api_group, version, k8s_namespace, "podgroups", group["metadata"]["name"])
            assert stored["spec"] == group["spec"]
    code, out, _ = cli(capsys, "delete", gang_name, "-n", k8s_namespace, "--kubeconfig", str(control_plane.kubeconfig))
    assert code == 0
    if group is not None:
        assert f"podgroup/{group['metadata']['name']} deleted" in out.splitlines()
