"""The chart's ValidatingAdmissionPolicy (issue 31 item 2: what RBAC cannot say), its CEL evaluated by a real CEL
implementation (cel-python) against the requests the webhook's ServiceAccount really makes and the attacks a
compromised webhook pod would try.

The requests are built from the product's own code where it writes: the notary's outcome merge patch
(`records.record_patch`) applied to a gang StatefulSet and Job of examples/, its Event (`records.event`), the launcher
ConfigMap (`launcher_configmap.configmap`), self-managed certificates' caBundle JSON patch (selfcerts' shape) applied
to the rendered MutatingWebhookConfiguration. A request is evaluated as the API server does: matchConstraints, then
matchConditions (only the webhook's ServiceAccount), then the variables, then every validation; an expression that
fails to evaluate refuses (failurePolicy Fail). tests/cluster/test_rbac_matrix_cluster.py checks the RBAC side on a
real API server (v1.20, which serves no ValidatingAdmissionPolicy).
"""

from __future__ import annotations

import copy
import datetime as dt
import json
from pathlib import Path
from typing import Any

import celpy
import jsonpatch
import kubernetes_validate
import pytest
import yaml

from chart_render import CHART, RELEASE, find, render_chart, run_helm
from trainhook.webhook import launcher_configmap as lcm
from trainhook.webhook.notary import records
from trainhook.webhook.notary.membership import Gang, WorkloadRef

NAMESPACE = "ml-platform"
WEBHOOK_USER = f"system:serviceaccount:{NAMESPACE}:trainhook"
VAP_API = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CEL = celpy.Environment()


def render_served(values: dict | None = None, api_versions: tuple[str, ...] = (VAP_API,)) -> list[dict]:
    """`helm template` as against an API server that serves `api_versions` (what `helm install` sees)."""
    rbac = {"gangNamespaces": [], "admissionPolicy": "auto", **(values or {}).get("rbac", {})}
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--set-json", f"rbac={json.dumps(rbac)}"]
    for version in api_versions:
        args += ["--api-versions", version]
    for key, value in (values or {}).items():
        if key != "rbac":
            args += ["--set-json", f"{key}={json.dumps(value)}"]
    return [doc for doc in yaml.safe_load_all(run_helm(*args)) if doc]


# --- evaluating the policy as the API server does -----------------------------------------------------------------

def _cel(value: Any) -> Any:
    return celpy.json_to_cel(value)


def _run(expression: str, activation: dict) -> Any:
    """The expression's value, or the CELEvalError it raised (CEL's own error value)."""
    try:
        return CEL.program(CEL.compile(expression)).evaluate(activation)
    except celpy.CELEvalError as e:
        return e


def _verdict(value: Any) -> bool | None:
    """True or False for a CEL bool; None for anything else (an error, a value of another type)."""
    return bool(value) if isinstance(value, celpy.celtypes.BoolType) else None


def _matches(spec: dict, request: dict) -> bool:
    resource = request["resource"]["resource"] + (f"/{request['subResource']}" if request["subResource"] else "")
    return any(request["resource"]["group"] in rule["apiGroups"] and resource in rule["resources"]
               and request["operation"] in rule["operations"] for rule in spec["matchConstraints"]["resourceRules"])


def admit(policy: dict, request: dict) -> str | None:
    """None when the policy lets `request` through; else the refusal's message."""
    spec = policy["spec"]
    if not _matches(spec, request):
        return None
    activation = {"request": _cel(request), "object": _cel(request["object"]), "oldObject": _cel(request["oldObject"])}
    for condition in spec["matchConditions"]:
        if _verdict(_run(condition["expression"], activation)) is not True:
            return None
    variables: dict = {}
    for variable in spec["variables"]:
        activation["variables"] = celpy.celtypes.MapType(variables)
        variables[celpy.celtypes.StringType(variable["name"])] = _run(variable["expression"], activation)
    activation["variables"] = celpy.celtypes.MapType(variables)
    for validation in spec["validations"]:
        result = _run(validation["expression"], activation)
        verdict = _verdict(result)
        if verdict is not True:
            return validation["message"] if verdict is False else f"{validation['message']} (error: {result})"
    return None


def refused(policy: dict, request: dict) -> str:
    """The refusal's message, which a validation's logic gave (not an expression that failed to evaluate)."""
    said = admit(policy, request)
    assert said is not None, f"allowed: {request['operation']} {request['resource']} {request['subResource']}"
    assert "(error: " not in said, said
    return said


def request(operation: str, group: str, resource: str, obj: dict | None, old: dict | None, *,
            namespace: str = "team-a", sub: str = "", user: str = WEBHOOK_USER) -> dict:
    return {"operation": operation, "resource": {"group": group, "version": "v1", "resource": resource},
            "subResource": sub, "namespace": namespace, "userInfo": {"username": user},
            "object": obj, "oldObject": old}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386, what the API server applies for application/merge-patch+json."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


# --- the objects ---------------------------------------------------------------------------------------------------

def example(kind: str) -> dict:
    for path in sorted(EXAMPLES.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == kind and "trainhook.dev/framework" in doc["metadata"].get("labels", {}):
                stored = copy.deepcopy(doc)
                stored["metadata"].update(namespace="team-a", uid="5c1e-uid", resourceVersion="41",
                                          annotations={"team.example/owner": "ana", **doc["metadata"].get(
                                              "annotations", {})})
                return stored
    raise AssertionError(f"no labeled {kind} in examples/")


OUTCOME = {"phase": "Failed", "code": 1, "reason": "rank 1 exited 1", "rank": 1, "time": "2026-01-01T00:00:00Z",
           "attempt": 2, "pod": "ddp-1", "logs": {1: "Traceback ..."}, "pods": {1: "ddp-1"}}


def recorded(workload: dict) -> dict:
    return merge_patch(workload, records.record_patch(OUTCOME, workload["metadata"]["resourceVersion"]))


def notary_event(namespace: str = "team-a") -> dict:
    workload = WorkloadRef(kind="StatefulSet", name="ddp", uid="5c1e-uid")
    gang = Gang(namespace=namespace, job="ddp", anchor_pod="ddp-0", anchor_workload=workload, coordinator=True)
    return records.event(gang, workload, "Warning", "GangFailed", "gang failed", dt.datetime.now(dt.timezone.utc), "k1")


def with_ca_bundle(config: dict) -> dict:
    """What webhook/selfcerts.py's JSON patch (a test and an add per webhook) makes of the configuration."""
    patch = []
    for index, webhook in enumerate(config["webhooks"]):
        patch += [{"op": "test", "path": f"/webhooks/{index}/name", "value": webhook["name"]},
                  {"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": "LS0tLS1CRUdJTi0="}]
    return jsonpatch.apply_patch(config, patch)


def changed(obj: dict, path: list, value: Any) -> dict:
    out = copy.deepcopy(obj)
    place = out
    for key in path[:-1]:
        place = place[key]
    if value is None:
        del place[path[-1]]
    else:
        place[path[-1]] = value
    return out


@pytest.fixture(scope="module")
def manifests() -> list[dict]:
    return render_served()


@pytest.fixture(scope="module")
def policy(manifests) -> dict:
    return find(manifests, "ValidatingAdmissionPolicy")


# --- feature detection, validity ---------------------------------------------------------------------------------

def test_installed_where_the_api_server_serves_it_and_bound_to_deny():
    served = render_served()
    vap = find(served, "ValidatingAdmissionPolicy")
    binding = find(served, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": vap["metadata"]["name"], "validationActions": ["Deny"]}
    assert vap["spec"]["failurePolicy"] == "Fail"
    assert vap["spec"]["matchConditions"] == [{"name": "the-webhooks-serviceaccount",
                                               "expression": f'request.userInfo.username == "{WEBHOOK_USER}"'}]
    not_served = render_served(api_versions=())
    assert not [m for m in not_served if "AdmissionPolicy" in m["kind"]]
    # Forced either way by the value.
    assert not [m for m in render_served({"rbac": {"admissionPolicy": False}}) if "AdmissionPolicy" in m["kind"]]
    assert find(render_served({"rbac": {"admissionPolicy": True}}, api_versions=()), "ValidatingAdmissionPolicy")
    # `helm template` with no cluster: not served, so not rendered.
    assert not [m for m in render_chart({}, NAMESPACE) if "AdmissionPolicy" in m["kind"]]


@pytest.mark.parametrize("version", ["1.30", "1.31", "1.33", ".".join(kubernetes_validate.latest_version().split(
    ".")[:2])])
def test_the_policy_and_binding_are_valid_kubernetes_from_1_30(manifests, version):
    for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
        kubernetes_validate.validate(find(manifests, kind), f"{version}.0", strict=True)


@pytest.mark.parametrize("values", [
    {}, {"certificates": {"mode": "cert-manager"}}, {"gangKey": {"existingSecret": "mine"}},
    {"rbac": {"gangNamespaces": ["team-a"]}}, {"fullnameOverride": "th"}], ids=str)
def test_every_expression_compiles_in_every_mode(values):
    spec = find(render_served(values), "ValidatingAdmissionPolicy")["spec"]
    for item in spec["matchConditions"] + spec["variables"] + spec["validations"]:
        CEL.compile(item["expression"])  # raises CELParseError naming the place


# --- what the product writes: allowed ----------------------------------------------------------------------------

def test_what_the_product_writes_is_allowed(manifests, policy):
    sts, job = example("StatefulSet"), example("Job")
    config = find(manifests, "MutatingWebhookConfiguration")
    launcher = lcm.configmap(lcm.configmap_name(b"zip", b"#!/bin/sh\n"), "default", b"zip", b"#!/bin/sh\n")
    writes = {
        "the outcome on a StatefulSet": request("UPDATE", "apps", "statefulsets", recorded(sts), sts),
        "the outcome on a Job": request("UPDATE", "batch", "jobs", recorded(job), job),
        "a scale to zero": request("UPDATE", "apps", "statefulsets", {"spec": {"replicas": 0}},
                                   {"spec": {"replicas": 2}}, sub="scale"),
        "a scale to zero, as served (0 is omitted)": request("UPDATE", "apps", "statefulsets", {"spec": {}},
                                                             {"spec": {"replicas": 2}}, sub="scale"),
        "the notary's Event": request("CREATE", "", "events", notary_event(), None),
        "the launcher ConfigMap": request("CREATE", "", "configmaps", launcher, None, namespace="default"),
        "an old launcher ConfigMap removed": request("DELETE", "", "configmaps", None, launcher, namespace="default"),
        "the TLS Secret created": request("CREATE", "", "secrets", {"metadata": {"name": "trainhook-tls"}}, None,
                                          namespace=NAMESPACE),
        "the TLS Secret rotated": request("UPDATE", "", "secrets", {"metadata": {"name": "trainhook-tls"}, "data": {}},
                                          {"metadata": {"name": "trainhook-tls"}}, namespace=NAMESPACE),
        "the gang key's Secret created": request("CREATE", "", "secrets", {"metadata": {"name": "trainhook-gang-key"}},
                                                 None, namespace=NAMESPACE),
        "the caBundle written": request("UPDATE", "admissionregistration.k8s.io", "mutatingwebhookconfigurations",
                                        with_ca_bundle(config), config, namespace=""),
    }
    assert {what: admit(policy, r) for what, r in writes.items()} == {what: None for what in writes}


def test_nobody_else_is_evaluated(policy):
    sts = example("StatefulSet")
    evil = changed(sts, ["spec", "template", "spec", "containers", 0, "image"], "evil:latest")
    for user in ("kubernetes-admin", "system:serviceaccount:team-a:default",
                 f"system:serviceaccount:{NAMESPACE}:trainhook-uninstall-check"):
        assert admit(policy, request("UPDATE", "apps", "statefulsets", evil, sts, user=user)) is None


# --- what a compromised webhook pod would try: refused -------------------------------------------------------------

def workload_attacks() -> dict[str, tuple[dict, dict]]:
    sts = example("StatefulSet")
    unlabeled = changed(changed(sts, ["metadata", "labels"], {"app": "db"}), ["spec", "template", "metadata",
                                                                              "labels"], {"app": "db"})
    return {
        "a pod template written": (changed(recorded(sts), ["spec", "template", "spec", "containers", 0, "image"],
                                           "evil:latest"), sts),
        "a ServiceAccount swapped in": (changed(sts, ["spec", "template", "spec", "serviceAccountName"], "admin"), sts),
        "scaled up through the object": (changed(sts, ["spec", "replicas"], 50), sts),
        "a label that is not trainhook's": (changed(sts, ["metadata", "labels", "team"], "b"), sts),
        "a user's annotation removed": (changed(sts, ["metadata", "annotations", "team.example/owner"], None), sts),
        "the gang label changed": (changed(sts, ["metadata", "labels", "trainhook.dev/framework"], "mpi"), sts),
        "the gang label removed": (changed(sts, ["metadata", "labels", "trainhook.dev/framework"], None), sts),
        "an ownerReference for the garbage collector": (changed(sts, ["metadata", "ownerReferences"], [{
            "apiVersion": "v1", "kind": "ConfigMap", "name": "gone", "uid": "0000"}]), sts),
        "a finalizer": (changed(sts, ["metadata", "finalizers"], ["example.com/never"]), sts),
        "an outcome on a StatefulSet that is no gang": (recorded(unlabeled), unlabeled),
    }


@pytest.mark.parametrize("attack", list(workload_attacks()))
def test_statefulset_writes_beyond_trainhook_metadata_are_refused(policy, attack):
    new, old = workload_attacks()[attack]
    said = refused(policy, request("UPDATE", "apps", "statefulsets", new, old))
    assert said and "only change trainhook.dev/* labels and annotations of a trainhook gang" in said


def test_job_writes_beyond_trainhook_metadata_and_creates_and_deletes_are_refused(policy):
    job = example("Job")
    for new in (changed(job, ["spec", "parallelism"], 64), changed(job, ["spec", "suspend"], True),
                changed(recorded(job), ["spec", "template", "spec", "containers", 0, "command"], ["sh", "-c", "x"])):
        assert refused(policy, request("UPDATE", "batch", "jobs", new, job))
    sts = example("StatefulSet")
    assert refused(policy, request("CREATE", "apps", "statefulsets", sts, None))
    assert refused(policy, request("DELETE", "apps", "statefulsets", None, sts))
    assert refused(policy, request("CREATE", "batch", "jobs", job, None))


@pytest.mark.parametrize("replicas", [1, 2, 100])
def test_a_scale_other_than_to_zero_is_refused(policy, replicas):
    said = refused(policy, request("UPDATE", "apps", "statefulsets", {"spec": {"replicas": replicas}},
                                 {"spec": {"replicas": 0}}, sub="scale"))
    assert said == "the webhook's ServiceAccount may only scale a StatefulSet to zero"


@pytest.mark.parametrize(("operation", "name", "immutable"), [
    ("CREATE", "coredns", True), ("CREATE", "aws-auth", True), ("CREATE", "trainhook-launcher-0123", False),
    ("DELETE", "coredns", True), ("DELETE", "kube-proxy", True), ("UPDATE", "trainhook-launcher-0123", True)])
def test_configmaps_other_than_launcher_ones_are_refused(policy, operation, name, immutable):
    body = {"metadata": {"name": name, "namespace": "default"}, "immutable": immutable, "data": {"x": "y"}}
    new, old = {"CREATE": (body, None), "DELETE": (None, body), "UPDATE": (body, body)}[operation]
    said = refused(policy, request(operation, "", "configmaps", new, old, namespace="default"))
    assert said and "trainhook-launcher-*" in said


@pytest.mark.parametrize(("operation", "name", "namespace"), [
    ("CREATE", "stolen", NAMESPACE), ("CREATE", "trainhook-tls", "team-a"), ("UPDATE", "trainhook-gang-key", NAMESPACE),
    ("DELETE", "trainhook-tls", NAMESPACE)])
def test_secrets_other_than_its_own_are_refused(policy, operation, name, namespace):
    body = {"metadata": {"name": name, "namespace": namespace}}
    new, old = {"CREATE": (body, None), "DELETE": (None, body), "UPDATE": (body, body)}[operation]
    said = refused(policy, request(operation, "", "secrets", new, old, namespace=namespace))
    assert said and "may only create its own Secrets (trainhook-tls, trainhook-gang-key)" in said


def test_with_a_secret_of_the_users_the_gang_key_secret_is_not_its_own(manifests):
    policy = find(render_served({"gangKey": {"existingSecret": "mine"}}), "ValidatingAdmissionPolicy")
    for name in ("mine", "trainhook-gang-key"):
        assert refused(policy, request("CREATE", "", "secrets", {"metadata": {"name": name}}, None, namespace=NAMESPACE))
    assert admit(policy, request("CREATE", "", "secrets", {"metadata": {"name": "trainhook-tls"}}, None,
                                 namespace=NAMESPACE)) is None


@pytest.mark.parametrize("attack", ["another source", "about a Secret", "about another namespace's object"])
def test_events_other_than_the_notarys_are_refused(policy, attack):
    event = notary_event()
    event = {"another source": lambda: changed(event, ["source", "component"], "kubelet"),
             "about a Secret": lambda: changed(event, ["involvedObject", "kind"], "Secret"),
             "about another namespace's object": lambda: changed(event, ["involvedObject", "namespace"],
                                                                 "kube-system")}[attack]()
    assert refused(policy, request("CREATE", "", "events", event, None))


FIRST = ["webhooks", 0]
CONFIGURATION_ATTACKS = {
    "failurePolicy Ignore": lambda c: changed(c, [*FIRST, "failurePolicy"], "Ignore"),
    "every object, not the labeled ones": lambda c: changed(c, [*FIRST, "objectSelector"], {}),
    "kube-system too": lambda c: changed(c, [*FIRST, "namespaceSelector"], {}),
    "more resources": lambda c: changed(c, [*FIRST, "rules", 0, "resources"], ["*"]),
    "another service": lambda c: changed(c, [*FIRST, "clientConfig", "service", "name"], "evil"),
    "a URL instead": lambda c: changed(c, [*FIRST, "clientConfig"], {"url": "https://evil.example/mutate"}),
    "a webhook added": lambda c: changed(c, ["webhooks"], [*c["webhooks"], {**c["webhooks"][0],
                                                                          "name": "evil.trainhook.dev"}]),
    "a webhook removed": lambda c: changed(c, ["webhooks"], c["webhooks"][1:]),
    "a label changed": lambda c: changed(c, ["metadata", "labels", "app.kubernetes.io/managed-by"], "me"),
}


@pytest.mark.parametrize("attack", list(CONFIGURATION_ATTACKS))
def test_a_webhook_configuration_change_beyond_the_ca_bundle_is_refused(manifests, policy, attack):
    config = with_ca_bundle(find(manifests, "MutatingWebhookConfiguration"))
    new = CONFIGURATION_ATTACKS[attack](config)
    said = refused(policy, request("UPDATE", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", new,
                                 config, namespace=""))
    assert said and "may only change the caBundle of its own MutatingWebhookConfiguration" in said


def test_another_webhook_configuration_and_deletes_are_refused(manifests, policy):
    config = find(manifests, "MutatingWebhookConfiguration")
    other = changed(config, ["metadata", "name"], "istio-sidecar-injector")
    group, resource = "admissionregistration.k8s.io", "mutatingwebhookconfigurations"
    assert refused(policy, request("UPDATE", group, resource, with_ca_bundle(other), other, namespace=""))
    assert refused(policy, request("DELETE", group, resource, None, config, namespace=""))
    assert refused(policy, request("CREATE", group, resource, other, None, namespace=""))
