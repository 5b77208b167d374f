"""The chart's pre-delete check (issue 23 item 10, values uninstallCheck), as the real Helm renders it: a hook Job
that Helm runs before deleting anything, deletes afterwards whatever its result (nothing of it is left, even after
a forced `--no-hooks` uninstall), whose lines Helm prints, which runs as a ServiceAccount of its own that may list
pods and nothing else (issue 31: never the webhook's, whose rights are the notary's), and whose arguments the module's own parser reads. tests/cluster/test_uninstall_check_cluster.py
runs it against a real API server; tests/e2e/test_e2e_install_lifecycle.py runs `helm uninstall` on the node."""

from __future__ import annotations

import pytest

from chart_render import find, find_all, render_chart
from trainhook.webhook import uninstall_check

NAMESPACE = "ml-platform"


def check_job(values: dict | None = None) -> dict:
    return find(render_chart(values or {}, NAMESPACE), "Job", "trainhook-uninstall-check")


def test_the_check_is_a_pre_delete_hook_that_helm_deletes_and_prints_when_it_fails():
    job = check_job()
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "pre-delete"
    assert set(annotations["helm.sh/hook-delete-policy"].split(",")) == {
        "before-hook-creation", "hook-succeeded", "hook-failed"}
    assert annotations["helm.sh/hook-output-log-policy"] == "hook-failed"
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_warn_prints_the_lines_of_a_check_that_succeeds_too_and_off_renders_nothing():
    job = check_job({"uninstallCheck": "warn"})
    assert job["metadata"]["annotations"]["helm.sh/hook-output-log-policy"] == "hook-succeeded,hook-failed"
    assert not find_all(render_chart({"uninstallCheck": "off"}, NAMESPACE), "Job")


def test_it_runs_as_its_own_service_account_that_may_list_pods_and_nothing_else():
    manifests = render_chart({}, NAMESPACE)
    pod = find(manifests, "Job")["spec"]["template"]["spec"]
    webhook = find(manifests, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    assert pod["serviceAccountName"] == "trainhook-uninstall-check" != webhook
    account = find(manifests, "ServiceAccount", "trainhook-uninstall-check")
    assert account["automountServiceAccountToken"] is False and pod["automountServiceAccountToken"] is True
    assert find(manifests, "ClusterRole", "trainhook-uninstall-check")["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    subject = [{"kind": "ServiceAccount", "name": "trainhook-uninstall-check", "namespace": NAMESPACE}]
    bound = [b for b in find_all(manifests, "RoleBinding") + find_all(manifests, "ClusterRoleBinding")
             if b["subjects"] == subject]
    assert [(b["kind"], b["roleRef"]["name"]) for b in bound] == [("ClusterRoleBinding", "trainhook-uninstall-check")]
    # Ordinary objects of the release (not hooks): they exist when the pre-delete hook runs and go with the rest.
    for kind in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding"):
        assert "helm.sh/hook" not in (find(manifests, kind, "trainhook-uninstall-check")["metadata"].get("annotations")
                                      or {})
    assert not [m for m in render_chart({"uninstallCheck": "off"}, NAMESPACE) if "uninstall" in m["metadata"]["name"]]
    # As hardened as the webhook itself.
    (container,) = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["runAsNonRoot"] is True


@pytest.mark.parametrize("values,mode,excluded", [
    ({}, "refuse", {"kube-system", NAMESPACE}),
    ({"uninstallCheck": "warn", "excludeNamespaces": ["monitoring"]}, "warn", {"kube-system", NAMESPACE, "monitoring"}),
])
def test_the_modules_own_parser_reads_what_the_chart_passes(values, mode, excluded):
    (container,) = check_job(values)["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["python", "-m", "trainhook.webhook.uninstall_check"]
    args = uninstall_check.parse_args(container["args"])
    assert (args.mode, args.release, args.release_namespace) == (mode, "trainhook", NAMESPACE)
    assert set(args.exclude_namespaces.split(",")) == excluded
    assert container["image"] == find(render_chart(values, NAMESPACE), "Deployment")["spec"]["template"]["spec"][
        "containers"][0]["image"]  # the webhook's image: nothing else to pull or trust
