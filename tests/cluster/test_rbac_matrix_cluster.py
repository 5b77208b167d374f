"""Every ServiceAccount the chart creates may do exactly what docs/operate/security.md lists (issue 31 item 2), on the
real v1.20 API server: the chart's rendered ServiceAccounts, Roles, ClusterRoles and bindings are applied, each
ServiceAccount asks the API server with its own token what it may do in each namespace (a SelfSubjectRulesReview, what
`kubectl auth can-i --list` asks), and the answer, less what every ServiceAccount may do anyway (discovery, its own
reviews: the namespace's `default` ServiceAccount's answer), must equal the doc's table expanded for that render.
Each render's matrix is printed (`pytest -s`), the doc's row for each right beside it.

Then the attacks of the issue, tried for real with the ServiceAccounts' tokens: ConfigMaps in kube-system, a
StatefulSet outside the gang namespaces, the uninstall check reading anything but a pod list. v1.20 serves no
ValidatingAdmissionPolicy: what it adds is evaluated by CEL in tests/chart/test_chart_admission_policy.py.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from chart_render import render_chart
from cluster_api import wait_for_service_account_token

pytestmark = pytest.mark.cluster

DOC = Path(__file__).resolve().parents[2] / "docs" / "operate" / "security.md"
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
ACCOUNTS = {"webhook": "{fullname}", "uninstall-check": "{fullname}-uninstall-check"}


def doc_rows() -> list[dict]:
    """The rows of the doc's rbac-table, as dicts keyed by its header."""
    text = DOC.read_text()
    table = text[text.index("<!-- rbac-table"):text.index("<!-- /rbac-table -->")].splitlines()[1:]
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in table if line.startswith("|")]
    header, rows = cells[0], cells[2:]
    assert header == ["ServiceAccount", "when", "where", "API group", "resource", "names", "verbs", "why"], header
    assert all(len(row) == len(header) for row in rows), [row for row in rows if len(row) != len(header)]
    return [dict(zip(header, row)) for row in rows]


def applies(when: str, values: dict) -> bool:
    return {"always": True,
            "gang key made by the webhook": not values.get("gangKey", {}).get("existingSecret"),
            "self-managed certificates": values.get("certificates", {}).get("mode", "self-managed") == "self-managed",
            "launcherConfigMap": values.get("launcherConfigMap", True) and bool(values.get("trainingNamespaces")),
            "scaleCheck": values.get("scaleCheck", True),
            "uninstallCheck": values.get("uninstallCheck", "refuse") != "off"}[when]


def reaches(where: str, namespace: str, values: dict, release_namespace: str) -> bool:
    gang_namespaces = values.get("rbac", {}).get("gangNamespaces") or []
    return {"cluster": True,
            "gang namespaces": not gang_namespaces or namespace in gang_namespaces,
            "release namespace": namespace == release_namespace,
            "each of trainingNamespaces": namespace in values.get("trainingNamespaces", [])}[where]


def expected(account: str, namespace: str, values: dict, release_namespace: str, fullname: str) -> dict[tuple, str]:
    """{(group, resource, name, verb): the doc's why} that `account` may do in `namespace`, per the doc."""
    out = {}
    for row in doc_rows():
        if row["ServiceAccount"] != account or not applies(row["when"], values) or \
                not reaches(row["where"], namespace, values, release_namespace):
            continue
        group = row["API group"].strip('"')
        names = re.findall(r"`([^`]+)`", row["names"]) or ["*"]
        if "gangKey.existingSecret" in row["names"] and values.get("gangKey", {}).get("existingSecret"):
            names = [values["gangKey"]["existingSecret"]]
        for resource in row["resource"].split(", "):
            for name in names:
                for verb in row["verbs"].split(", "):
                    key = ("(URL)", resource, "", verb) if group == "(URL)" else \
                        (group, resource, name.replace("<fullname>", fullname), verb)
                    out[key] = row["why"]
    return out


def effective(api_client, namespace: str) -> set[tuple]:
    """What the token's owner may do in `namespace`, by the API server's own SelfSubjectRulesReview."""
    review = client.AuthorizationV1Api(api_client).create_self_subject_rules_review(
        {"spec": {"namespace": namespace}}).status
    assert not review.incomplete, review.evaluation_error
    out = set()
    for rule in review.resource_rules:
        for group in rule.api_groups or [""]:
            for resource in rule.resources or []:
                for name in rule.resource_names or ["*"]:
                    out |= {(group, resource, name, verb) for verb in rule.verbs}
    for rule in review.non_resource_rules:
        out |= {("(URL)", url, "", verb) for url in rule.non_resource_urls for verb in rule.verbs}
    return out


def create(admin_client, manifest: dict) -> None:
    kind, namespace = manifest["kind"], manifest["metadata"].get("namespace")
    rbac, core = client.RbacAuthorizationV1Api(admin_client), client.CoreV1Api(admin_client)
    {"ServiceAccount": lambda: core.create_namespaced_service_account(namespace, manifest),
     "Role": lambda: rbac.create_namespaced_role(namespace, manifest),
     "RoleBinding": lambda: rbac.create_namespaced_role_binding(namespace, manifest),
     "ClusterRole": lambda: rbac.create_cluster_role(manifest),
     "ClusterRoleBinding": lambda: rbac.create_cluster_role_binding(manifest)}[kind]()


@pytest.fixture
def namespaces(control_plane, k8s_namespace):
    """(release, training, gang, other): the release's namespace and three more, deleted afterwards."""
    names = [f"{role}-{uuid.uuid4().hex[:6]}" for role in ("training", "gang", "other")]
    with control_plane.api_client() as admin_client:
        core = client.CoreV1Api(admin_client)
        for name in names:
            core.create_namespace({"metadata": {"name": name}})
        try:
            yield (k8s_namespace, *names)
        finally:
            for name in names:
                core.delete_namespace(name)


@pytest.fixture
def install(control_plane, namespaces):
    """install(values) applies the chart's RBAC for `values` (a release in the release namespace) and answers
    (fullname, {account: token}, the `default` ServiceAccount's token); removed afterwards."""
    made: list[dict] = []

    def install_rbac(values: dict):
        fullname = f"th-{uuid.uuid4().hex[:8]}"
        manifests = [m for m in render_chart({"fullnameOverride": fullname, **values}, namespaces[0])
                     if m["kind"] in RBAC_KINDS]
        with control_plane.api_client() as admin_client:
            for kind in RBAC_KINDS:
                for manifest in manifests:
                    if manifest["kind"] == kind:
                        create(admin_client, manifest)
                        made.append(manifest)
            accounts = {m["metadata"]["name"] for m in manifests if m["kind"] == "ServiceAccount"}
            tokens = {account: wait_for_service_account_token(admin_client, namespaces[0], name.format(
                fullname=fullname)) for account, name in ACCOUNTS.items() if name.format(fullname=fullname) in accounts}
            baseline = wait_for_service_account_token(admin_client, namespaces[0], "default")
        return fullname, tokens, baseline

    yield install_rbac
    with control_plane.api_client() as admin_client:
        rbac = client.RbacAuthorizationV1Api(admin_client)
        for manifest in reversed(made):
            meta = manifest["metadata"]
            try:
                {"ClusterRole": lambda: rbac.delete_cluster_role(meta["name"]),
                 "ClusterRoleBinding": lambda: rbac.delete_cluster_role_binding(meta["name"]),
                 }.get(manifest["kind"], lambda: None)()  # namespaced objects go with their namespace
            except ApiException as e:
                if e.status != 404:
                    raise


def scopes(training: str, gang: str) -> dict[str, dict]:
    return {
        "every namespace (default)": {"trainingNamespaces": [training]},
        "rbac.gangNamespaces": {"trainingNamespaces": [training], "rbac": {"gangNamespaces": [gang]}},
        "the fewest rights": {"trainingNamespaces": [training], "rbac": {"gangNamespaces": [gang]},
                              "certificates": {"mode": "cert-manager"}, "gangKey": {"existingSecret": "my-gang-key"},
                              "launcherConfigMap": False, "scaleCheck": False, "uninstallCheck": "off"},
    }


@pytest.mark.parametrize("scope", list(scopes("t", "g")))
def test_every_service_account_may_do_exactly_what_the_security_doc_lists(control_plane, namespaces, install, scope):
    release, training, gang, other = namespaces
    values = scopes(training, gang)[scope]
    fullname, tokens, baseline_token = install(values)
    assert set(tokens) == ({"webhook", "uninstall-check"} if applies("uninstallCheck", values) else {"webhook"})
    problems, lines = [], [f"\n=== {scope}: {values}"]
    with control_plane.token_client(baseline_token) as baseline_client:
        for account, token in tokens.items():
            with control_plane.token_client(token) as api:
                for namespace in (release, training, gang, other, "kube-system"):
                    baseline = effective(baseline_client, namespace)
                    everything = effective(api, namespace)
                    got = everything - baseline
                    want = expected(account, namespace, values, release, fullname)
                    label = {release: "release", training: "training", gang: "gang", other: "other"}.get(
                        namespace, namespace)
                    lines.append(f"--- {account} in {label} ({namespace}): {len(got)} rights")
                    lines += [f"    {verb:<7} {group or 'core'}/{resource}{'' if name == '*' else f' [{name}]'}"
                              for group, resource, name, verb in sorted(got, key=lambda r: (r[0], r[1], r[3], r[2]))]
                    # Exact, beyond what every ServiceAccount may do anyway (a row the chart grants that is also
                    # in that baseline, e.g. the OpenID key set on clusters that bind it for all, is checked granted).
                    if got - set(want) or set(want) - everything:
                        problems.append(f"{account} in {label}: granted but not in the doc: "
                                        f"{sorted(got - set(want))}; in the doc but not granted: "
                                        f"{sorted(set(want) - everything)}")
    print("\n".join(lines))
    assert not problems, "\n".join(problems)


def test_the_issues_attacks_are_refused_by_the_api_server(control_plane, namespaces, install):
    """What issue 31 did with `kubectl --as` against a default install, with the chart's tokens now."""
    release, training, gang, other = namespaces
    statefulset = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db"},
                   "spec": {"replicas": 2, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
                            "template": {"metadata": {"labels": {"app": "db"}},
                                         "spec": {"containers": [{"name": "db", "image": "db:1"}]}}}}
    evil = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"evil-{uuid.uuid4().hex[:6]}"}}
    # The default scope: no ConfigMap rights outside trainingNamespaces, kube-system's least of all.
    _, tokens, _ = install({"trainingNamespaces": [training]})
    with control_plane.api_client() as admin_client, control_plane.token_client(tokens["webhook"]) as webhook:
        core, apps = client.CoreV1Api(webhook), client.AppsV1Api(webhook)
        for namespace in ("kube-system", other):
            for attempt in (lambda: core.create_namespaced_config_map(namespace, evil),
                            lambda: core.list_namespaced_config_map(namespace),
                            lambda: core.delete_namespaced_config_map("extension-apiserver-authentication", namespace),
                            lambda: core.read_namespaced_secret("anything", namespace)):
                with pytest.raises(ApiException) as refused:
                    attempt()
                assert refused.value.status == 403, namespace
        # In a training namespace, its launcher ConfigMaps: allowed (the policy narrows it to trainhook-launcher-*).
        core.create_namespaced_config_map(training, {**evil, "metadata": {"name": "trainhook-launcher-0"}})

        # Scoped to a gang namespace: a StatefulSet elsewhere can be neither patched nor scaled.
        client.AppsV1Api(admin_client).create_namespaced_stateful_set(other, statefulset)
    _, tokens, _ = install({"trainingNamespaces": [training], "rbac": {"gangNamespaces": [gang]}})
    with control_plane.token_client(tokens["webhook"]) as webhook, \
            control_plane.token_client(tokens["uninstall-check"]) as check:
        apps = client.AppsV1Api(webhook)
        template = {"spec": {"template": {"spec": {"containers": [{"name": "db", "image": "evil:1"}]}}}}
        for attempt in (lambda: apps.patch_namespaced_stateful_set("db", other, template),
                        lambda: apps.patch_namespaced_stateful_set_scale("db", other, {"spec": {"replicas": 5}}),
                        lambda: client.CoreV1Api(webhook).list_namespaced_pod(other)):
            with pytest.raises(ApiException) as refused:
                attempt()
            assert refused.value.status == 403
        # The uninstall check: one list of pods, nothing else.
        checker = client.CoreV1Api(check)
        seen = {p.metadata.name for p in
                checker.list_pod_for_all_namespaces(label_selector="trainhook.dev/framework").items}
        with control_plane.api_client() as admin:  # the same pods the admin lists (other tests' gangs may be there)
            assert seen == {p.metadata.name for p in client.CoreV1Api(admin).list_pod_for_all_namespaces(
                label_selector="trainhook.dev/framework").items}
        for attempt in (lambda: checker.read_namespaced_pod("anything", gang),
                        lambda: checker.list_namespaced_config_map(release),
                        lambda: checker.list_namespaced_secret(release),
                        lambda: client.AppsV1Api(check).patch_namespaced_stateful_set("db", other, template)):
            with pytest.raises(ApiException) as refused:
                attempt()
            assert refused.value.status == 403
