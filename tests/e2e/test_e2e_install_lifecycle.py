"""The release's whole life on the node (issue 23 items 4, 5, 9, 10): install, gang, upgrade, uninstall, reinstall.

- `helm install` naming a training namespace created just before it (each of trainingNamespaces must exist at
  install: the webhook's ConfigMap rights are a Role in each, docs/operate/helm.md) succeeds and renders that Role
  there; the webhook writes its launcher ConfigMap there within its round (a minute): immutable, owned by the
  ClusterRole `<fullname>-launcher`, and a gang there starts without an init container.
- Both replicas log `gang key loaded` with the fingerprint of the key in the Secret; no webhook pod mounts a CA
  key; `helm upgrade` (new pods) keeps the fingerprint.
- `helm uninstall` while a gang runs is refused by the pre-delete check (uninstallCheck: refuse), naming the gang
  and the fix, and the release stays as it was; once the gang is gone it uninstalls, and within about a minute
  nothing of the release is left but the gang-key Secret (the TLS Secret and every launcher ConfigMap go with
  their owners, by the garbage collector).
- Reinstalled, the key's fingerprint is the same, and a gang runs.

The other e2e tests share the session's release (conftest.py `release`): this test starts from it and leaves it as
it found it, reinstalled with the fixture's values (also when it fails). Run under `flock -x
/tmp/trainhook-node.lock`: no other test may use the node while the webhook is away.
"""

from __future__ import annotations

import base64
import json
import time
import uuid

import pytest

from e2e_gangs import delete_gang, phase_of, pods_of, statefulset_gang
from e2e_helpers import RELEASE, RELEASE_NAMESPACE, REPO, helm, image_values, wait_for
from trainhook.webhook.notary.gang_key import fingerprint, key_bytes

CHART = str(REPO / "charts" / "trainhook")
GANG_KEY_SECRET, TLS_SECRET = f"{RELEASE}-gang-key", f"{RELEASE}-tls"
LAUNCHER_OWNER = f"{RELEASE}-launcher"
QUICK = ["python", "-c", "import os; print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])"]
LONG = ["python", "-c", "import time; time.sleep(900)"]
# Kinds a release renders (and its hook Job), all labeled app.kubernetes.io/instance=<release>.
RELEASE_KINDS = ("deployments,services,serviceaccounts,roles,rolebindings,poddisruptionbudgets.v1beta1.policy,"
                 "jobs,networkpolicies")
CLUSTER_KINDS = "clusterroles,clusterrolebindings,mutatingwebhookconfigurations"


def get(node, *args: str) -> dict:
    return json.loads(node.kubectl("get", *args, "-o", "json"))


def install(node, action: str, *values: str) -> None:
    helm(node, action, RELEASE, CHART, "--namespace", RELEASE_NAMESPACE, "--create-namespace", "--wait",
         "--timeout", "240s", *image_values(node.images), *values)
    wait_for(lambda: all(w["clientConfig"].get("caBundle") for w in get(
        node, "mutatingwebhookconfiguration", RELEASE)["webhooks"]), 60, "the webhook to inject its caBundle")


def uninstall(node, *flags: str) -> str:
    return helm(node, "uninstall", RELEASE, "--namespace", RELEASE_NAMESPACE, "--wait", "--timeout", "180s", *flags)


def release_status(node) -> str | None:
    """The release's Helm status (deployed, uninstalling, ...), None when there is none."""
    try:
        return json.loads(helm(node, "status", RELEASE, "--namespace", RELEASE_NAMESPACE, "-o", "json"))["info"][
            "status"]
    except AssertionError as e:
        if "not found" in str(e):
            return None
        raise


def secret_fingerprint(node) -> str:
    secret = get(node, "secret", GANG_KEY_SECRET, "-n", RELEASE_NAMESPACE)
    return fingerprint(key_bytes(base64.b64decode(secret["data"]["gang-key"])))


def webhook_pods(node) -> list[dict]:
    pods = get(node, "pods", "-n", RELEASE_NAMESPACE, "-l", "app.kubernetes.io/component=webhook")["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def logged_fingerprints(node) -> dict[str, str]:
    """{pod: the fingerprint its `gang key loaded` line carries} of every running webhook replica."""
    found = {}
    for pod in webhook_pods(node):
        for line in node.logs(RELEASE_NAMESPACE, pod["metadata"]["name"], "webhook").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if "gang key loaded" in json.dumps(record):
                found[pod["metadata"]["name"]] = record.get("fingerprint")
    return found


def replicas_agree(node, expected: str) -> dict:
    def both():
        prints = logged_fingerprints(node)
        return prints if len(prints) == 2 else None
    prints = wait_for(both, 60, "both replicas to log `gang key loaded`")
    assert set(prints.values()) == {expected}, prints
    return prints


def assert_no_ca_key_mounted(node) -> None:
    for pod in webhook_pods(node):
        for volume in pod["spec"].get("volumes") or []:
            secret = volume.get("secret") or {}
            if secret:  # self-managed mode reads its Secret through the API: nothing of it is mounted
                items = [item["key"] for item in secret.get("items") or []]
                assert secret["secretName"] != TLS_SECRET and "ca.key" not in items, (pod["metadata"]["name"], volume)
            for source in (volume.get("projected") or {}).get("sources") or []:
                assert "ca.key" not in json.dumps(source), (pod["metadata"]["name"], volume)


def launcher_configmaps(node, namespace: str | None = None) -> list[dict]:
    where = ["-n", namespace] if namespace else ["-A"]
    return get(node, "configmaps", *where, "-l", "app.kubernetes.io/managed-by=trainhook-webhook")["items"]


def run_gang(node, namespace: str, name: str) -> None:
    """A 2-pod gang of the user's torch image under the delivered launcher succeeds; in a training namespace its pods
    mount the launcher ConfigMap and have no init container."""
    delete_gang(node, name, namespace)
    try:
        node.apply(namespace, statefulset_gang(name, node.images["torch"], QUICK, 2))
        spec = wait_for(lambda: node.pod(namespace, f"{name}-1")["spec"], 60, f"pod {name}-1")
        assert "initContainers" not in spec, spec.get("initContainers")
        (launcher,) = [v for v in spec["volumes"] if v["name"] == "trainhook-launcher"]
        assert launcher["configMap"]["name"].startswith("trainhook-launcher-"), launcher
        wait_for(lambda: phase_of(node, name, namespace).get("trainhook.dev/phase") == "Succeeded", 180,
                 f"gang {namespace}/{name} to succeed", interval=2)
    except BaseException:
        print(node.describe(namespace))
        raise
    finally:
        delete_gang(node, name, namespace, wait=False)


def running_gang_pods(node) -> list[str]:
    """What the pre-delete check counts: pods labeled trainhook.dev/framework, Pending or Running, not deleted."""
    pods = get(node, "pods", "-A", "-l", "trainhook.dev/framework")["items"]
    return [f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in pods
            if not p["metadata"].get("deletionTimestamp") and p["status"].get("phase") in ("Pending", "Running")]


def whats_left(node, training_namespaces: list[str]) -> dict:
    """What of the release exists now: its labeled objects (the launcher's Roles in the training namespaces too),
    the TLS Secret, launcher ConfigMaps, other Secrets."""
    selector = f"app.kubernetes.io/instance={RELEASE}"
    left = {"objects": [f"{o['kind']}/{o['metadata']['name']}" for o in
                        get(node, RELEASE_KINDS, "-n", RELEASE_NAMESPACE, "-l", selector)["items"] +
                        get(node, CLUSTER_KINDS, "-l", selector)["items"] +
                        [o for ns in training_namespaces
                         for o in get(node, "roles,rolebindings", "-n", ns, "-l", selector)["items"]]],
            "configmaps": [f"{c['metadata']['namespace']}/{c['metadata']['name']}" for ns in training_namespaces
                           for c in launcher_configmaps(node, ns)]}
    secrets = get(node, "secrets", "-n", RELEASE_NAMESPACE)["items"]
    left["secrets"] = sorted(s["metadata"]["name"] for s in secrets if not (
        s["type"] == "kubernetes.io/service-account-token" and
        s["metadata"].get("annotations", {}).get("kubernetes.io/service-account.name") == "default"))
    return left


def test_install_gang_upgrade_uninstall_and_reinstall(node, release):
    later = f"e2e-later-{uuid.uuid4().hex[:6]}"
    training = ["default", later]
    values = ["--set", f"trainingNamespaces={{{','.join(training)}}}"]
    key = secret_fingerprint(node)  # the session's release made it (or found it)
    t0 = time.monotonic()
    try:
        # From the session's release to none. Forced: gangs other tests left are not this test's to judge.
        uninstall(node, "--no-hooks")
        wait_for(lambda: not get(node, "secrets", "-n", RELEASE_NAMESPACE, "--field-selector",
                                 f"metadata.name={TLS_SECRET}")["items"], 90, "the session's TLS Secret to go")

        # Install naming a namespace created just before (it must exist at install: the webhook's Role goes there).
        node.kubectl("create", "namespace", later)
        install(node, "install", *values)
        print(f"install: {time.monotonic() - t0:.0f}s")
        configmap_rule = get(node, "role", LAUNCHER_OWNER, "-n", later)["rules"][0]
        assert (configmap_rule["resources"], configmap_rule["verbs"]) == (
            ["configmaps"], ["create", "get", "list", "delete"]), configmap_rule
        wait_for(lambda: get(node, "serviceaccount", "default", "-n", later).get("secrets"), 30, "its token")
        (configmap,) = wait_for(lambda: launcher_configmaps(node, later), 90,
                                f"the launcher ConfigMap in the new namespace {later}", interval=2)
        assert configmap["immutable"] is True
        owner = get(node, "clusterrole", LAUNCHER_OWNER)
        (ref,) = configmap["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"]) == ("ClusterRole", LAUNCHER_OWNER, owner["metadata"]["uid"]), ref
        run_gang(node, later, "life-first")
        print(f"gang in the new namespace: {time.monotonic() - t0:.0f}s")

        # One key for both replicas, the Secret's; no CA key in any pod.
        before = replicas_agree(node, key)
        assert_no_ca_key_mounted(node)

        # Upgrade: new pods (a changed pod annotation), the same key.
        install(node, "upgrade", *values, "--set", "podAnnotations.e2e/rollout=upgraded")
        wait_for(lambda: {p["metadata"]["name"] for p in webhook_pods(node)}.isdisjoint(before) and
                 len(webhook_pods(node)) == 2, 120, "the upgrade's new webhook pods")
        replicas_agree(node, key)
        assert_no_ca_key_mounted(node)
        print(f"upgrade: {time.monotonic() - t0:.0f}s")

        # Uninstall while a gang runs: refused, naming it; the release stays.
        node.apply(later, statefulset_gang("life-long", node.images["torch"], LONG, 1))
        wait_for(lambda: [p for p in pods_of(node, "life-long", later) if p["status"].get("phase") == "Running"],
                 120, "the long gang to run", interval=1)
        with pytest.raises(AssertionError) as refused:
            uninstall(node)
        said = str(refused.value)
        print(said)
        assert f"Job/{RELEASE_NAMESPACE}/{RELEASE}-uninstall-check" in said and "Failed" in said, said
        # Helm (3.18+, the hook's output log policy) prints the check's lines: the gang, the fix.
        assert f"refusing to uninstall release {RELEASE}: 1 training gang is still running" in said, said
        assert f"{later}/life-long: StatefulSet life-long (1 pod)" in said, said
        assert f"helm uninstall {RELEASE} -n {RELEASE_NAMESPACE} --no-hooks" in said, said
        # Nothing was deleted: the webhook serves on; Helm deleted the failed check's Job. Helm marks the release
        # `uninstalling`, and `helm rollback` (docs/operate/helm.md) makes it `deployed` again for upgrades.
        assert len(webhook_pods(node)) == 2 and get(node, "mutatingwebhookconfiguration", RELEASE)
        assert not get(node, "jobs", "-n", RELEASE_NAMESPACE)["items"]
        print("status after the refusal:", release_status(node))
        helm(node, "rollback", RELEASE, "--namespace", RELEASE_NAMESPACE, "--wait", "--timeout", "120s")
        assert release_status(node) == "deployed"
        print(f"refused uninstall: {time.monotonic() - t0:.0f}s")

        # Drained, it uninstalls; within a minute only the gang key is left.
        delete_gang(node, "life-long", later)
        wait_for(lambda: not running_gang_pods(node), 90, "no gang pod to run (what other tests left finishing)")
        uninstall(node)

        def only_the_key_left():
            left = whats_left(node, training)
            return left if left == {"objects": [], "configmaps": [], "secrets": [GANG_KEY_SECRET]} else None
        try:
            wait_for(only_the_key_left, 90, "nothing but the gang key to be left", interval=2)
        except BaseException:
            print(whats_left(node, training))
            raise
        print(f"uninstalled: {time.monotonic() - t0:.0f}s")
    finally:
        # Back to the session's release, with the fixture's values (a release this test left half-way is removed
        # first: an `uninstalling` or failed release cannot be upgraded).
        if release_status(node) not in (None, "deployed"):
            uninstall(node, "--no-hooks")
        install(node, "upgrade", "--install", "--reset-values")
        node.kubectl("delete", "namespace", later, "--wait=false", check=False)
    # Reinstalled: the same key, and a gang runs.
    replicas_agree(node, key)
    assert secret_fingerprint(node) == key
    run_gang(node, "default", "life-after")
    print(f"reinstalled and ran a gang: {time.monotonic() - t0:.0f}s")
