"""The real control plane works: API calls, admission, controllers and RBAC (no webhook involved)."""

from __future__ import annotations


import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from cluster_api import wait_for_service_account_token, webhook_configuration
from helpers import wait_for as _wait_for

pytestmark = pytest.mark.cluster




def test_controllers_create_pending_pods(control_plane, k8s_namespace):
    ns = k8s_namespace
    with control_plane.api_client() as api:
        assert client.VersionApi(api).get_code().git_version == "v1.20.2"
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)

        core.create_namespaced_config_map(ns, {"metadata": {"name": "settings"}, "data": {"k": "v"}})
        assert core.read_namespaced_config_map("settings", ns).data == {"k": "v"}

        labels = {"app": "smoke"}
        core.create_namespaced_service(ns, {
            "metadata": {"name": "smoke"},
            "spec": {"clusterIP": "None", "selector": labels, "ports": [{"port": 80}]},
        })
        apps.create_namespaced_stateful_set(ns, {
            "metadata": {"name": "smoke"},
            "spec": {
                "replicas": 2, "serviceName": "smoke", "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels},
                             "spec": {"containers": [{"name": "main", "image": "registry.example/none:1"}]}},
            },
        })

        def pods():
            items = core.list_namespaced_pod(ns, label_selector="app=smoke").items
            return items if len(items) == 2 else None

        items = _wait_for("the StatefulSet controller's two pods", pods)
        assert sorted(p.metadata.name for p in items) == ["smoke-0", "smoke-1"]
        for pod in items:
            assert pod.status.phase == "Pending"  # no kubelet
            assert pod.metadata.owner_references[0].kind == "StatefulSet"
            # The ServiceAccount admission plugin mounted the token the controller-manager minted.
            assert any(v.secret and v.secret.secret_name.startswith("default-token-") for v in pod.spec.volumes)
            assert pod.metadata.labels["statefulset.kubernetes.io/pod-name"] == pod.metadata.name


def test_rbac_denies_an_unprivileged_service_account(control_plane, k8s_namespace):
    ns = k8s_namespace
    with control_plane.api_client() as api:
        core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
        core.create_namespaced_service_account(ns, {"metadata": {"name": "nobody"}})
        token = wait_for_service_account_token(api, ns, "nobody")

        with control_plane.token_client(token) as as_sa:
            sa_core = client.CoreV1Api(as_sa)
            with pytest.raises(ApiException) as denied:
                sa_core.list_namespaced_secret("kube-system")
            assert denied.value.status == 403
            # Authenticated as the ServiceAccount (not anonymous), then refused by RBAC.
            assert f"system:serviceaccount:{ns}:nobody" in denied.value.body
            with pytest.raises(ApiException) as denied:
                sa_core.list_namespaced_config_map(ns)
            assert denied.value.status == 403

            rbac.create_namespaced_role(ns, {
                "metadata": {"name": "read-configmaps"},
                "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}],
            })
            rbac.create_namespaced_role_binding(ns, {
                "metadata": {"name": "nobody-reads-configmaps"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-configmaps"},
                "subjects": [{"kind": "ServiceAccount", "name": "nobody", "namespace": ns}],
            })
            _wait_for("the RoleBinding to take effect", lambda: _can_list_configmaps(sa_core, ns), timeout=10)
            with pytest.raises(ApiException) as denied:
                sa_core.list_namespaced_secret(ns)
            assert denied.value.status == 403


def _can_list_configmaps(core: client.CoreV1Api, ns: str) -> bool:
    try:
        core.list_namespaced_config_map(ns)
        return True
    except ApiException as e:
        if e.status != 403:
            raise
        return False


def test_webhook_configuration_is_accepted_by_the_api_server(control_plane):
    """The configuration register_webhook creates is valid for the API server (server-side dry run)."""
    body = webhook_configuration(control_plane.ca_pem, "https://127.0.0.1:9/mutate")
    with control_plane.api_client() as api:
        created = client.AdmissionregistrationV1Api(api).create_mutating_webhook_configuration(body, dry_run="All")
    assert [w.name for w in created.webhooks] == ["workloads.trainhook.dev", "services.trainhook.dev"]
    # As the chart registers them (tests/chart/test_chart.py): pods at CREATE only, the workloads and Services at
    # both, and the kinds that never make a gang at both, to be refused by name when labeled.
    operations = {rule.resources[0]: rule.operations for w in created.webhooks for rule in w.rules}
    assert operations == {"pods": ["CREATE"], "statefulsets": ["CREATE", "UPDATE"], "jobs": ["CREATE", "UPDATE"],
                          "services": ["CREATE", "UPDATE"], "deployments": ["CREATE", "UPDATE"],
                          "replicasets": ["CREATE", "UPDATE"], "daemonsets": ["CREATE", "UPDATE"],
                          "replicationcontrollers": ["CREATE", "UPDATE"]}
    assert all(w.failure_policy == "Fail" and w.side_effects == "None" for w in created.webhooks)
