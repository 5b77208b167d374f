"""The chart's tolerations reach only the pods they are meant for (issue 23 item 6), over real HTTPS.

The attack: the webhook added the chart's tolerations to every pod labeled trainhook.dev/framework, in every
namespace, and anyone who may create a pod can write that label (with trainhook.dev/launcher: none the pod need not
even train). So a tainted GPU pool was one label away for every namespace. Now an entry is added only in the
namespaces named for it (`tolerationNamespaces`) and, when it says `requiresResource`, only to pods that request
that resource; the nvidia.com/gpu toleration of a pod that requests GPUs stays everywhere (Kubernetes'
ExtendedResourceToleration). The chart's side: the values reach the server's own parser, and tolerations without
namespaces are refused at install.
"""

from __future__ import annotations

import json
import os

import pytest

from chart_render import HelmError, find, render_chart
from objects import bare_pod, container, pod_of_statefulset, statefulset
from test_server_https import admitted
from trainhook.gang import keys
from trainhook.webhook import server
from webhook_process import start_webhook

POOL = {"key": "dedicated", "operator": "Equal", "value": "training", "effect": "NoSchedule"}
GPU_POOL = {"key": "pool", "operator": "Equal", "value": "gpu", "effect": "NoExecute"}
CHART_TOLERATIONS = [POOL, {**GPU_POOL, "requiresResource": "nvidia.com/gpu"}]
GPU = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def start(tmp_path_factory, namespaces: str):
    return start_webhook(tmp_path_factory.mktemp("webhook-tolerations"), extra_args=[
        "--tolerations", json.dumps(CHART_TOLERATIONS), "--toleration-namespaces", namespaces])


@pytest.fixture(scope="module")
def scoped(tmp_path_factory):
    hook = start(tmp_path_factory, "team-a,team-b")
    yield hook
    hook.stop()


def in_namespace(obj: dict, namespace: str) -> dict:
    obj["metadata"]["namespace"] = namespace
    return obj


def gang_pod(webhook, namespace: str, gpus: int = 0) -> dict:
    """A StatefulSet's pod as the API server sends it: the workload admitted first, then its pod."""
    sts, response = admitted(webhook, in_namespace(statefulset("g", 2, containers=[container(gpus=gpus)]), namespace))
    assert response["allowed"] is True, response
    return pod_of_statefulset(sts, 1)


def tolerations_of(webhook, pod: dict) -> list[dict]:
    out, response = admitted(webhook, pod)
    assert response["allowed"] is True, response
    again, _ = admitted(webhook, out)  # idempotent: a second pass adds nothing
    assert again == out
    return out["spec"].get("tolerations") or []


def test_a_labeled_pod_outside_the_named_namespaces_gets_none_of_the_charts_tolerations(scoped):
    # The attacker's pod: a bare pod in their own namespace with the label and launcher: none, and a GPU request.
    attacker = in_namespace(bare_pod("sneak", {keys.JOB_NAME: "sneak", keys.INDEX: "0"},
                                     {keys.REPLICAS: "worker=1", keys.LAUNCHER: "none"},
                                     containers=[container(gpus=1)]), "web")
    assert tolerations_of(scoped, attacker) == [GPU]  # Kubernetes' own rule for a GPU pod, nothing of the chart's
    assert tolerations_of(scoped, gang_pod(scoped, "web")) == []


def test_a_pod_in_a_named_namespace_gets_the_entries_without_a_resource(scoped):
    assert tolerations_of(scoped, gang_pod(scoped, "team-a")) == [POOL]
    assert tolerations_of(scoped, gang_pod(scoped, "team-b")) == [POOL]


def test_an_entry_that_requires_a_resource_goes_only_to_pods_requesting_it(scoped):
    # The GPU toleration first (a GPU pod's own), then the chart's entries, trainhook's key left out of the pod.
    assert tolerations_of(scoped, gang_pod(scoped, "team-a", gpus=2)) == [GPU, POOL, GPU_POOL]
    # A request in another container (a sidecar) counts, as it does for the scheduler; a zero request does not.
    pod = gang_pod(scoped, "team-a")
    pod["spec"]["containers"].append({"name": "side", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}})
    assert tolerations_of(scoped, pod) == [POOL, GPU_POOL]
    pod = gang_pod(scoped, "team-a")
    pod["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/gpu": "0"}, "limits": {"nvidia.com/gpu": "0"}}
    assert tolerations_of(scoped, pod) == [POOL]


def test_the_users_own_tolerations_are_kept_and_never_doubled(scoped):
    pod = gang_pod(scoped, "team-a", gpus=1)
    own = {"key": "spot", "operator": "Exists"}
    pod["spec"]["tolerations"] = [own, dict(POOL)]
    assert tolerations_of(scoped, pod) == [own, POOL, GPU, GPU_POOL]


def test_star_names_every_namespace_the_webhook_serves(tmp_path_factory):
    hook = start(tmp_path_factory, "*")
    try:
        assert tolerations_of(hook, gang_pod(hook, "anywhere")) == [POOL]
        assert tolerations_of(hook, gang_pod(hook, "anywhere", gpus=1)) == [GPU, POOL, GPU_POOL]
    finally:
        hook.stop()


def test_no_namespace_named_means_no_pod_gets_them_but_a_gpu_pod_keeps_its_own(webhook):
    # The session's webhook has no chart tolerations at all; a GPU pod still gets the GPU toleration.
    assert tolerations_of(webhook, gang_pod(webhook, "team-a", gpus=1)) == [GPU]


# --- the chart ----------------------------------------------------------------------------------------------------

def webhook_settings(manifests: list[dict], monkeypatch):
    """The Settings the server's own parser reads from the Deployment the chart renders."""
    (container_spec,) = find(manifests, "Deployment")["spec"]["template"]["spec"]["containers"]
    for variable in [v for v in os.environ if v.startswith("TRAINHOOK_WEBHOOK_")]:
        monkeypatch.delenv(variable)
    for item in container_spec["env"]:
        if "value" in item:
            monkeypatch.setenv(item["name"], item["value"])
    return server.parse_args(container_spec["args"]).settings


def test_the_chart_passes_tolerations_and_their_namespaces_to_the_server(monkeypatch):
    settings = webhook_settings(render_chart({"tolerations": CHART_TOLERATIONS,
                                              "tolerationNamespaces": ["team-a", "team-b"]}), monkeypatch)
    assert settings.extra_tolerations == tuple(CHART_TOLERATIONS)
    assert settings.toleration_namespaces == {"team-a", "team-b"}
    assert webhook_settings(render_chart({"tolerations": [POOL], "tolerationNamespaces": ["*"]}),
                            monkeypatch).toleration_namespaces == {"*"}
    default = webhook_settings(render_chart({}), monkeypatch)
    assert (default.extra_tolerations, default.toleration_namespaces) == ((), frozenset())


def test_tolerations_without_namespaces_fail_the_install_naming_the_value():
    """The chart before gave them to every labeled pod: an upgrade that keeps only `tolerations` must say that they
    now need namespaces, not silently stop adding them."""
    with pytest.raises(HelmError) as caught:
        render_chart({"tolerations": [POOL]})
    assert "tolerations are set but tolerationNamespaces is empty" in caught.value.stderr
    assert 'or ["*"] for every namespace the webhook serves' in caught.value.stderr


@pytest.mark.parametrize("values,where", [
    ({"tolerations": [{**POOL, "requiresResource": "not a resource!"}], "tolerationNamespaces": ["a"]},
     "/tolerations/0/requiresResource"),
    ({"tolerations": [POOL], "tolerationNamespaces": ["Team_A"]}, "/tolerationNamespaces/0"),
])
def test_bad_values_are_refused_naming_the_path(values, where):
    with pytest.raises(HelmError) as caught:
        render_chart(values)
    assert where in caught.value.stderr


def test_the_server_refuses_a_requires_resource_that_is_no_resource_name(capsys):
    with pytest.raises(SystemExit):
        server.parse_args(["--tls-cert", "c", "--tls-key", "k", "--tolerations",
                           json.dumps([{**POOL, "requiresResource": "gpu please"}])])
    assert "toleration 0: requiresResource='gpu please' is not a resource name" in capsys.readouterr().err
