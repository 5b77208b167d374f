"""The chart's notary (issue 22), rendered by the real Helm: its port on the Deployment and the Service, its RBAC
(exactly what docs/operate/security.md lists), the settings the webhook reads from the chart's environment in each
certificate mode, and no RBAC at all for training pods.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from chart_render import HelmError, find, find_all, render_chart, render_notes
from trainhook.certs.build import build_ca
from trainhook.webhook import server
from trainhook.webhook.settings import notary_ca_pem

NAMESPACE = "ml-platform"
CA_PEM = build_ca("notary-chart-test-ca", dt.datetime.now(dt.timezone.utc)).cert_pem.decode()
MODES = {"self-managed": {}, "cert-manager": {"certificates": {"mode": "cert-manager"}},
         "secret": {"certificates": {"mode": "secret", "secretName": "user-tls", "caBundle": CA_PEM}}}
NOTARY_RULES = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["apps"], "resources": ["statefulsets"], "verbs": ["get", "patch"]},
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "patch"]},
    {"apiGroups": ["apps"], "resources": ["statefulsets/scale"], "verbs": ["patch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
]
TOKENREVIEW_RULES = [{"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
                     {"nonResourceURLs": ["/.well-known/openid-configuration", "/openid/v1/jwks"], "verbs": ["get"]}]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {mode: render_chart(values, NAMESPACE) for mode, values in MODES.items()}


def container(manifests: list[dict]) -> dict:
    (webhook,) = find(manifests, "Deployment")["spec"]["template"]["spec"]["containers"]
    return webhook


def env_of(manifests: list[dict]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container(manifests)["env"] if "value" in e}


@pytest.mark.parametrize("mode", list(MODES))
def test_the_notary_role_is_exactly_what_the_notary_needs_bound_to_the_webhook_only(rendered, mode):
    manifests = rendered[mode]
    fullname = find(manifests, "Deployment")["metadata"]["name"]
    assert find(manifests, "ClusterRole", f"{fullname}-notary")["rules"] == NOTARY_RULES
    assert find(manifests, "ClusterRole", f"{fullname}-tokenreviews")["rules"] == TOKENREVIEW_RULES
    account = find(manifests, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    for role in ("notary", "tokenreviews"):
        binding = find(manifests, "ClusterRoleBinding", f"{fullname}-{role}")
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                      "name": f"{fullname}-{role}"}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]
    assert find(manifests, "Deployment")["spec"]["template"]["spec"]["automountServiceAccountToken"] is True


@pytest.mark.parametrize("values", [{}, {"trainingNamespaces": ["team-a", "team-b"]}], ids=["default", "listed"])
def test_the_chart_binds_nothing_to_training_pods(values):
    """No group binding (system:serviceaccounts:<ns> gave every pod of a namespace exec and StatefulSet writes),
    no training ClusterRole, and every binding's only subject is the webhook's own ServiceAccount."""
    manifests = render_chart(values, NAMESPACE)
    account = find(manifests, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    check = find(manifests, "Job")["spec"]["template"]["spec"]["serviceAccountName"]
    assert not [r for r in find_all(manifests, "ClusterRole") if r["metadata"]["name"].endswith("-training")]
    for binding in find_all(manifests, "RoleBinding") + find_all(manifests, "ClusterRoleBinding"):
        # the webhook's own ServiceAccount, or the uninstall check's (tests/chart/test_chart_uninstall.py)
        assert binding["subjects"] in ([{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}],
                                       [{"kind": "ServiceAccount", "name": check, "namespace": NAMESPACE}]), binding
    for role in find_all(manifests, "Role") + find_all(manifests, "ClusterRole"):
        for rule in role["rules"]:
            assert "pods/exec" not in rule.get("resources", []), role["metadata"]["name"]


def test_a_values_file_that_still_binds_training_service_accounts_is_refused_naming_the_fix():
    with pytest.raises(HelmError) as refused:
        render_chart({"trainingServiceAccounts": [{"namespace": "team-a", "name": "trainer"}]}, NAMESPACE)
    assert "trainingServiceAccounts was removed" in str(refused.value)
    assert "docs/operate/helm.md#upgrading" in str(refused.value)


@pytest.mark.parametrize("port", [8444, 9444])
def test_the_notary_listens_on_its_port_and_the_service_exposes_it_under_the_injected_url(port):
    manifests = render_chart({"notary": {"port": port}}, NAMESPACE)
    service = find(manifests, "Service")
    [notary_port] = [p for p in service["spec"]["ports"] if p["name"] == "notary"]
    assert notary_port == {"name": "notary", "port": port, "targetPort": "notary", "protocol": "TCP"}
    [container_port] = [p for p in container(manifests)["ports"] if p["name"] == "notary"]
    assert container_port["containerPort"] == port
    env = env_of(manifests)
    assert env["TRAINHOOK_WEBHOOK_NOTARY_AUTHORITY"] == "cluster"
    assert env["TRAINHOOK_WEBHOOK_NOTARY_PORT"] == str(port)
    assert env["TRAINHOOK_WEBHOOK_NOTARY_URL"] == f"https://{service['metadata']['name']}.{NAMESPACE}.svc:{port}"


def test_the_notary_port_may_not_be_the_admission_port():
    with pytest.raises(HelmError, match="/notary/port"):
        render_chart({"notary": {"port": 9443}}, NAMESPACE)


@pytest.mark.parametrize(("mode", "ca_file"), [("self-managed", "/tmp/trainhook-certs/ca.crt"),
                                                ("cert-manager", "/tls/ca.crt"), ("secret", None)])
def test_the_webhook_reads_the_notary_url_and_ca_from_the_charts_settings(rendered, mode, ca_file, monkeypatch):
    """The chart's environment and arguments, parsed by the webhook itself: the URL as rendered, and the CA from
    where the mode keeps it (a file the webhook re-reads as it rotates), or the caBundle given in mode secret."""
    manifests = rendered[mode]
    for name, value in env_of(manifests).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    args = server.parse_args(list(container(manifests).get("args") or []))
    assert args.notary_authority == "cluster" and args.notary_port == 8444
    assert args.settings.notary_url == f"https://trainhook.{NAMESPACE}.svc:8444"
    if ca_file is None:
        assert notary_ca_pem(args.settings).strip() == CA_PEM.strip()
    else:
        assert callable(args.settings.notary_ca) and args.settings.notary_ca.path == Path(ca_file)
        assert notary_ca_pem(args.settings) == ""  # no such file on this machine: nothing, not an error


@pytest.mark.parametrize(("gang_namespaces", "swept"), [([], ""), (["team-a", "team-b"], "team-a,team-b")])
def test_the_notarys_sweep_looks_where_the_chart_lets_it(gang_namespaces, swept, monkeypatch):
    """The sweep (webhook/notary/sweep.py) lists Jobs in every namespace with the cluster-wide binding, and only in
    rbac.gangNamespaces with the namespaced ones (elsewhere its list would be refused), parsed by the webhook."""
    manifests = render_chart({"rbac": {"gangNamespaces": gang_namespaces}}, NAMESPACE)
    for name, value in env_of(manifests).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    args = server.parse_args(list(container(manifests).get("args") or []))
    assert (args.notary_namespaces, args.notary_sweep_interval) == (swept, 30.0)


def test_notes_say_training_pods_need_no_permission_and_where_outcomes_are():
    notes = render_notes({}, NAMESPACE)
    assert "Training pods need no Kubernetes API permission, and this release binds none to them" in notes
    assert "kubectl get statefulsets -L trainhook.dev/phase" in notes
    assert "trainhook-notary" in notes
