"""The gang-wait init container keeps the pod's QoS class (resources.py's wait_resources).

A Guaranteed pod is one whose every container, init containers included, has CPU and memory limits equal to its
requests. The wait's requests used to sit below its limits, so every labeled Guaranteed pod became Burstable (the
static CPU manager's exclusive cores lost, evicted earlier). The pods' QoS class is computed here by Kubernetes'
rule, written out plainly (pkg/apis/core/helper/qos), before and after the webhook's mutation;
tests/cluster/test_qos_cluster.py has the API server compute it.
"""

from __future__ import annotations

import copy
import json
from decimal import Decimal

import pytest

from chart_render import HelmError, render_chart
from objects import pod_of_statefulset, statefulset
from test_server_https import admitted
from test_tolerations import webhook_settings
from trainhook.gang import keys
from trainhook.webhook import server
from trainhook.webhook.admission.mutate import mutate
from trainhook.webhook.settings import Settings
from webhook_process import start_webhook

SETTINGS = Settings()
UNITS = {"m": Decimal("0.001"), "Mi": Decimal(2 ** 20), "Gi": Decimal(2 ** 30), "": Decimal(1)}


def amount(text: str) -> Decimal:
    """The few quantity forms these tests write."""
    for unit in ("Mi", "Gi", "m", ""):
        if text.endswith(unit) and text[:len(text) - len(unit)].replace(".", "").isdigit():
            return Decimal(text[:len(text) - len(unit)]) * UNITS[unit]
    raise ValueError(text)


def qos_class(spec: dict) -> str:
    """Kubernetes' GetPodQOS for CPU and memory: requests default to limits (the API server's defaulting)."""
    requests_set = limits_set = False
    guaranteed = True
    for container in (spec.get("initContainers") or []) + spec["containers"]:
        resources = container.get("resources") or {}
        limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
        requests = {**{k: v for k, v in limits.items() if k not in requests}, **requests}
        requests_set |= any(k in requests for k in ("cpu", "memory"))
        limits_set |= any(k in limits for k in ("cpu", "memory"))
        for name in ("cpu", "memory"):
            if name not in limits or amount(requests[name]) != amount(limits[name]):
                guaranteed = False
    if not requests_set and not limits_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def wired_pod(*resources: dict, init_resources: dict | None = None, pod_resources: dict | None = None,
              settings: Settings = SETTINGS) -> dict:
    """Rank 1 of a 2-pod gang whose containers have `resources` (the first is the training container), through
    the webhook's mutation of its StatefulSet and then of the pod."""
    sts = statefulset("ddp", 2)
    spec = sts["spec"]["template"]["spec"]
    first = spec["containers"][0]
    spec["containers"] = [dict(copy.deepcopy(first), name=f"c{i}" if i else first["name"], resources=r)
                          for i, r in enumerate(resources)]
    if init_resources is not None:
        spec["initContainers"] = [{"name": "prepare", "image": "busybox", "command": ["true"],
                                   "resources": init_resources}]
    if pod_resources is not None:
        spec["resources"] = pod_resources
    sts = mutate("StatefulSet", "CREATE", sts, "team-a", settings).obj
    before = pod_of_statefulset(sts, 1)
    after = mutate("Pod", "CREATE", copy.deepcopy(before), "team-a", settings).obj
    assert any(c["name"] == keys.GANG_WAIT_CONTAINER for c in after["spec"]["initContainers"])
    return {"before": before["spec"], "after": after["spec"]}


def wait_of(spec: dict) -> dict:
    [wait] = [c for c in spec["initContainers"] if c["name"] == keys.GANG_WAIT_CONTAINER]
    return wait.get("resources")


GUARANTEED = {"limits": {"cpu": "2", "memory": "4Gi"}}


@pytest.mark.parametrize("resources, cpu", [
    ([GUARANTEED], "1"),  # a whole core at most
    ([{"limits": {"cpu": "250m", "memory": "1Gi"}, "requests": {"cpu": "250m", "memory": "1Gi"}}], "250m"),
    ([{"limits": {"cpu": "50m", "memory": "256Mi"}}], "100m"),  # at least 100m
    ([{"limits": {"cpu": "300m", "memory": "1Gi"}}, {"limits": {"cpu": "200m", "memory": "1Gi"}}], "500m"),
])
def test_a_guaranteed_pod_stays_guaranteed(resources, cpu):
    pod = wired_pod(*resources)
    assert qos_class(pod["before"]) == "Guaranteed"
    assert qos_class(pod["after"]) == "Guaranteed"
    share = {"cpu": cpu, "memory": "128Mi"}
    assert wait_of(pod["after"]) == {"requests": share, "limits": share}


def test_the_wait_of_a_guaranteed_pod_adds_no_cpu_to_what_the_pod_asks():
    """The pod's effective request is the larger of its containers' sum and any init container's: the wait's CPU
    within the sum costs the scheduler nothing."""
    for resources in ([GUARANTEED], [{"limits": {"cpu": "250m", "memory": "1Gi"}}]):
        pod = wired_pod(*resources)
        asked = sum(amount(c["resources"]["limits"]["cpu"]) for c in pod["after"]["containers"])
        assert amount(wait_of(pod["after"])["requests"]["cpu"]) <= asked


@pytest.mark.parametrize("resources, init_resources, cpu", [
    ([{"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}], None, "1"),  # the example's
    ([GUARANTEED, {"requests": {"cpu": "100m"}}], None, "1"),  # one container short of Guaranteed, no CPU limit
    ([GUARANTEED], {"requests": {"cpu": "10m"}}, "1"),  # the user's own init container is Burstable
    ([{"requests": {"cpu": "100m"}, "limits": {"cpu": "500m"}}], None, "500m"),  # limited: within its limit
    ([{"limits": {"cpu": "2"}}, {"limits": {"cpu": "1"}}], None, "1"),  # a whole core at most
])
def test_a_burstable_pod_stays_burstable_and_the_wait_has_up_to_a_core_to_burst(resources, init_resources, cpu):
    pod = wired_pod(*resources, init_resources=init_resources)
    assert qos_class(pod["before"]) == qos_class(pod["after"]) == "Burstable"
    assert wait_of(pod["after"]) == {"requests": {"cpu": "10m", "memory": "32Mi"},
                                     "limits": {"cpu": cpu, "memory": "128Mi"}}


@pytest.mark.parametrize("resources", [
    [{"requests": {"cpu": "100m"}, "limits": {"cpu": "500m", "memory": "1Gi"}}],
    [{"limits": {"cpu": "300m", "memory": "1Gi"}}, {"limits": {"cpu": "200m", "memory": "1Gi"}}],
    [GUARANTEED],
])
def test_the_wait_never_raises_the_pods_cpu_limit_that_a_quota_charges(resources):
    """A ResourceQuota on limits.cpu charges a pod the larger of its containers' sum and any init container's
    limit: the wait's limit stays within the sum (above 100m)."""
    pod = wired_pod(*resources)
    limited = sum(amount(c["resources"]["limits"]["cpu"]) for c in pod["after"]["containers"])
    assert amount(wait_of(pod["after"])["limits"]["cpu"]) <= limited


def test_a_best_effort_pod_gets_a_bounded_wait():
    """An injected container is always bounded: a pod that asked for nothing becomes Burstable."""
    pod = wired_pod({})
    assert qos_class(pod["before"]) == "BestEffort"
    assert qos_class(pod["after"]) == "Burstable"
    assert wait_of(pod["after"])["limits"] == {"cpu": "1", "memory": "128Mi"}


def test_pod_level_resources_bound_the_wait_too():
    """Kubernetes 1.32+ pod-level resources: the pod's own budget bounds every container, the wait included, so
    it gets no resources of its own (which could exceed that budget)."""
    pod = wired_pod({}, pod_resources={"limits": {"cpu": "4", "memory": "8Gi"}})
    assert wait_of(pod["after"]) is None


# --- the chart's gangWaitResources: for namespaces whose LimitRange refuses the defaults ----------------------------

CONFIGURED = {"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"cpu": "500m", "memory": "96Mi"}}


def test_configured_resources_are_the_waits_and_a_guaranteed_pod_gets_their_limits_as_requests(tmp_path):
    """Over HTTPS to a webhook started with --gang-wait-resources: a Burstable pod's wait gets them as given, a
    Guaranteed pod's their limits as requests too (it stays Guaranteed)."""
    hook = start_webhook(tmp_path, extra_args=["--gang-wait-resources", json.dumps(CONFIGURED)])
    try:
        for resources, expected, qos in (({"requests": {"cpu": "100m"}}, CONFIGURED, "Burstable"),
                                         (GUARANTEED, {"requests": CONFIGURED["limits"],
                                                       "limits": CONFIGURED["limits"]}, "Guaranteed")):
            sts = statefulset("ddp", 2)
            sts["spec"]["template"]["spec"]["containers"][0]["resources"] = resources
            sts, response = admitted(hook, sts)
            assert response["allowed"] is True, response
            pod, response = admitted(hook, pod_of_statefulset(sts, 1))
            assert response["allowed"] is True, response
            assert wait_of(pod["spec"]) == expected
            assert qos_class(pod["spec"]) == qos
            assert admitted(hook, pod)[0] == pod  # idempotent: a second pass changes nothing
    finally:
        hook.stop()


def test_the_chart_passes_gang_wait_resources_to_the_server(monkeypatch):
    assert webhook_settings(render_chart({"gangWaitResources": CONFIGURED}), monkeypatch).wait_resources == CONFIGURED
    assert webhook_settings(render_chart({}), monkeypatch).wait_resources == {}


@pytest.mark.parametrize("value, message", [
    ({"limits": {"cpu": "1"}}, "gangWaitResources.limits must give memory"),
    ({"requests": {"cpu": "2"}, "limits": {"cpu": "1", "memory": "1Gi"}},
     "gangWaitResources.requests.cpu=2 is more than its limit 1"),
    ({"limits": {"cpu": "lots", "memory": "1Gi"}}, "gangWaitResources.limits.cpu='lots' is not a quantity"),
    ({"limit": {"cpu": "1", "memory": "1Gi"}}, "gangWaitResources must be an object with requests and limits only"),
])
def test_the_server_refuses_gang_wait_resources_that_would_fail_every_pod_naming_the_value(value, message, capsys):
    with pytest.raises(SystemExit):
        server.parse_args(["--tls-cert", "c", "--tls-key", "k", "--gang-wait-resources", json.dumps(value)])
    assert message in capsys.readouterr().err


def test_the_charts_schema_refuses_a_malformed_value_naming_its_path():
    with pytest.raises(HelmError) as caught:
        render_chart({"gangWaitResources": {"limits": {"cpu": "one core"}}})
    assert "gangWaitResources" in caught.value.stderr
