"""The pre-delete check against a real API server (v1.20, with its controller-manager), run as the chart's Job runs it:
the module as a process, with the chart's arguments and a token of the Job's own ServiceAccount
`<fullname>-uninstall-check`, bound to its ClusterRole that may only list pods (issue 23 item 10, issue 31 item 2:
never the webhook's ServiceAccount, which holds the notary's rights). Without a kubelet, pods stay Pending: to the
check, a gang that has not finished, which is what an uninstall must not strand."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest
from kubernetes import client

from chart_render import find, render_chart
from cluster_api import cluster, wait_for_service_account_token
from helpers import wait_for
from objects import statefulset

pytestmark = pytest.mark.cluster


def labeled_pod(name: str, labels: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "main", "image": "example.com/train:1"}]}}


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory):
    """A control plane of this module's own: the check counts every training gang in the cluster, and the room's
    shared control plane still holds other modules' gangs (Pending pods, no kubelet to end them)."""
    cp = cluster.start(tmp_path_factory.mktemp("control-plane-uninstall"))
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture
def release(control_plane, k8s_namespace, tmp_path):
    """A release namespace with the chart's uninstall-check ServiceAccount, ClusterRole and binding (as rendered:
    nothing of the webhook's); yields a function running the chart's check Job command (with `values`) as that
    ServiceAccount: (exit code, output)."""
    fullname, release_ns = f"th-{uuid.uuid4().hex[:8]}", f"rel-{uuid.uuid4().hex[:8]}"
    with control_plane.api_client() as api:
        core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
        core.create_namespace({"metadata": {"name": release_ns}})
        manifests = render_chart({"fullnameOverride": fullname}, release_ns)
        checker = f"{fullname}-uninstall-check"
        account = find(manifests, "ServiceAccount", checker)
        # The Job runs as this ServiceAccount, and its ClusterRole may list pods and nothing else.
        assert find(manifests, "Job")["spec"]["template"]["spec"]["serviceAccountName"] == checker
        role = find(manifests, "ClusterRole", checker)
        assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
        binding = find(manifests, "ClusterRoleBinding", checker)
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": checker, "namespace": release_ns}]
        core.create_namespaced_service_account(release_ns, account)
        rbac.create_cluster_role(role)
        rbac.create_cluster_role_binding(binding)
        token = wait_for_service_account_token(api, release_ns, account["metadata"]["name"])
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(json.dumps(cluster.kubeconfig_dict(control_plane.host, control_plane.ca_pem,
                                                                 "uninstall-check", token=token)))

        def check(values: dict | None = None) -> tuple[int, str]:
            job = find(render_chart({"fullnameOverride": fullname, **(values or {})}, release_ns), "Job")
            (container,) = job["spec"]["template"]["spec"]["containers"]
            assert container["command"][:2] == ["python", "-m"]
            done = subprocess.run([sys.executable, *container["command"][1:], *container["args"]],
                                  capture_output=True, text=True, timeout=60,
                                  env={"KUBECONFIG": str(kubeconfig), "PATH": "/usr/bin:/bin"})
            return done.returncode, done.stdout + done.stderr

        try:
            yield {"check": check, "namespace": release_ns, "fullname": fullname, "checker": checker, "api": api}
        finally:
            rbac.delete_cluster_role_binding(checker)
            rbac.delete_cluster_role(checker)
            core.delete_namespace(release_ns)


def test_running_gangs_refuse_the_uninstall_naming_them_and_the_fix(release, k8s_namespace):
    api, ns = release["api"], k8s_namespace
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    assert release["check"]() == (0, "trainhook: no training gang is running; uninstalling release trainhook\n")
    sts = statefulset("ddp", 2)
    sts["metadata"]["namespace"] = ns
    sts["spec"]["podManagementPolicy"] = "Parallel"  # both pods at once (the webhook sets it on a gang)
    apps.create_namespaced_stateful_set(ns, sts)  # the controller-manager creates its 2 pods (Pending: no kubelet)
    core.create_namespaced_pod(ns, labeled_pod("solo-0", {"trainhook.dev/framework": "pytorch",
                                                          "trainhook.dev/job-name": "solo"}))
    core.create_namespaced_pod(ns, labeled_pod("web", {"app": "web"}))  # not a gang
    wait_for_service_account_token(api, release["namespace"], "default")
    core.create_namespaced_pod(release["namespace"], labeled_pod("own", {"trainhook.dev/framework": "pytorch"}))
    wait_for("the StatefulSet's pods", lambda: len(core.list_namespaced_pod(
        ns, label_selector="app=ddp").items) == 2)

    code, out = release["check"]()
    assert code == 1, out
    lines = out.splitlines()
    assert lines[0] == "trainhook: refusing to uninstall release trainhook: 2 training gangs are still running:"
    assert lines[1:3] == [f"  {ns}/ddp: StatefulSet ddp (2 pods)", f"  {ns}/solo: Pod solo-0 (1 pod)"]
    assert "re-create pods unwired (no RANK, no WORLD_SIZE, no launcher)" in out
    assert f"to uninstall anyway: helm uninstall trainhook -n {release['namespace']} --no-hooks" in out
    # Not the unlabeled pod "web", nor "own" in the release namespace (the webhook never serves it).
    assert lines[3].startswith("Without the webhook") and "/web" not in out and "/own" not in out

    code, out = release["check"]({"uninstallCheck": "warn"})
    assert code == 0 and out.startswith("trainhook: WARNING: uninstalling release trainhook while 2 training"), out

    # Drained: the StatefulSet scaled to zero (what the notary does to a finished gang), the bare pod deleted.
    apps.patch_namespaced_stateful_set_scale("ddp", ns, {"spec": {"replicas": 0}})
    core.delete_namespaced_pod("solo-0", ns)
    wait_for("the gang's pods to go", lambda: not core.list_namespaced_pod(
        ns, label_selector="trainhook.dev/framework").items)
    assert release["check"]()[0] == 0


def test_a_check_that_cannot_list_pods_refuses_rather_than_uninstall_blind(release):
    client.RbacAuthorizationV1Api(release["api"]).delete_cluster_role_binding(release["checker"])

    def refused():
        result = release["check"]()
        return result if result[0] == 1 else None
    code, out = wait_for("the binding's removal to reach the authorizer", refused)
    assert "refusing to uninstall release trainhook without knowing which gangs run" in out
    assert "403" in out or "Forbidden" in out, out
    assert "--no-hooks" in out
    client.RbacAuthorizationV1Api(release["api"]).create_cluster_role_binding(find(
        render_chart({"fullnameOverride": release["fullname"]}, release["namespace"]), "ClusterRoleBinding",
        release["checker"]))  # the fixture deletes it again
