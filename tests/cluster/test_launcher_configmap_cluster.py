"""The webhook keeps the launcher ConfigMap on a real API server (v1.20, with its garbage collector), as the chart's
ServiceAccount with only the chart's launcher rights (the ClusterRole that owns the ConfigMaps and may read only
itself, and a Role on ConfigMaps in each of trainingNamespaces): created immutable and owned by that ClusterRole, left
alone while it is right, an impostor under its name replaced, a namespace created after the install refused until a
`helm upgrade` lists it (its Role) and then served, old versions removed once no pod mounts them, and everything gone
when the ClusterRole is (helm uninstall)."""

from __future__ import annotations

import base64
import logging
import uuid

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from chart_render import find, render_chart
from cluster_api import wait_for_service_account_token
from helpers import wait_for
from trainhook.launcher import deliver
from trainhook.webhook import launcher_configmap as lcm
from trainhook.webhook.admission.delivery import launcher_configmap_volume

pytestmark = pytest.mark.cluster


def launcher_objects(manifests: list[dict]) -> list[dict]:
    """The chart's launcher rights: the objects of component `launcher`."""
    return [m for m in manifests if m["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "launcher"]


def create_launcher_roles(rbac, manifests: list[dict], namespaces: list[str]) -> None:
    """Create the rendered launcher Role and RoleBinding of each of `namespaces`, as `helm install` (or an upgrade
    that adds them) does."""
    for namespace in namespaces:
        for kind, create in [("Role", rbac.create_namespaced_role),
                             ("RoleBinding", rbac.create_namespaced_role_binding)]:
            [manifest] = [m for m in launcher_objects(manifests)
                          if m["kind"] == kind and m["metadata"]["namespace"] == namespace]
            create(namespace, manifest)


@pytest.fixture
def launcher_rbac(control_plane, k8s_namespace):
    """The chart's launcher ClusterRole, binding, Role and RoleBinding for a release in `k8s_namespace` with
    trainingNamespaces [k8s_namespace], created on the API server; yields (fullname, manifests, token, the name of a
    namespace a test may create after the install: deleted afterwards)."""
    fullname, later = f"th-{uuid.uuid4().hex[:8]}", f"later-{uuid.uuid4().hex[:8]}"
    manifests = render_chart({"fullnameOverride": fullname, "trainingNamespaces": [k8s_namespace]}, k8s_namespace)
    ours = launcher_objects(manifests)
    # ConfigMap rights only in the training namespace: a Role there, never a ClusterRole on ConfigMaps.
    assert sorted((m["kind"], m["metadata"].get("namespace")) for m in ours) == [
        ("ClusterRole", None), ("ClusterRoleBinding", None), ("Role", k8s_namespace), ("RoleBinding", k8s_namespace)]
    assert find(ours, "ClusterRole")["rules"] == [{"apiGroups": ["rbac.authorization.k8s.io"],
                                                   "resources": ["clusterroles"],
                                                   "resourceNames": [f"{fullname}-launcher"], "verbs": ["get"]}]
    account = find(manifests, "ServiceAccount", fullname)
    with control_plane.api_client() as admin_client:
        admin, rbac = client.CoreV1Api(admin_client), client.RbacAuthorizationV1Api(admin_client)
        admin.create_namespaced_service_account(k8s_namespace, account)
        rbac.create_cluster_role(find(ours, "ClusterRole"))
        rbac.create_cluster_role_binding(find(ours, "ClusterRoleBinding"))
        create_launcher_roles(rbac, manifests, [k8s_namespace])
        token = wait_for_service_account_token(admin_client, k8s_namespace, account["metadata"]["name"])
        try:
            yield fullname, manifests, token, later
        finally:
            for delete, name in [(rbac.delete_cluster_role_binding, f"{fullname}-launcher"),
                                 (rbac.delete_cluster_role, f"{fullname}-launcher"),
                                 (admin.delete_namespace, later)]:
                try:
                    delete(name)
                except ApiException as e:
                    if e.status != 404:
                        raise


def webhook_keeper(control_plane, token, namespaces, manifests, said, shim=None) -> lcm.Keeper:
    """`shim`: the entry point (default: the static program the webhook delivers, launcher/deliver.py)."""
    api = control_plane.token_client(token)
    owner = find(manifests, "ClusterRole", f"{find(manifests, 'Deployment')['metadata']['name']}-launcher")
    env = {e["name"]: e.get("value") for e in
           find(manifests, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["TRAINHOOK_WEBHOOK_LAUNCHER_OWNER"] == owner["metadata"]["name"]
    return lcm.Keeper(client.CoreV1Api(api), namespaces, deliver.build_zip(),
                      deliver.entry_program() if shim is None else shim,
                      owner=owner["metadata"]["name"], rbac_api=client.RbacAuthorizationV1Api(api), say=said.append)


def test_the_webhook_keeps_an_immutable_owned_configmap_and_replaces_an_impostor(control_plane, k8s_namespace,
                                                                                 launcher_rbac):
    _, manifests, token, _ = launcher_rbac
    said: list[str] = []
    keeper = webhook_keeper(control_plane, token, [k8s_namespace], manifests, said)
    name = keeper.name
    assert name == lcm.configmap_name(*lcm.content())  # named by the content's hash
    with control_plane.api_client() as admin_client:
        admin, rbac = client.CoreV1Api(admin_client), client.RbacAuthorizationV1Api(admin_client)
        assert keeper.round() == frozenset({k8s_namespace})
        assert said == []

        stored = admin.read_namespaced_config_map(name, k8s_namespace)
        assert stored.immutable is True
        assert base64.b64decode(stored.binary_data["launcher.pyz"]) == deliver.build_zip()
        assert stored.data is None and base64.b64decode(stored.binary_data["trainhook-launch"]) == \
            deliver.entry_program()
        assert stored.metadata.labels["app.kubernetes.io/managed-by"] == "trainhook-webhook"
        [ref] = stored.metadata.owner_references
        assert (ref.kind, ref.name, ref.uid) == ("ClusterRole", keeper.owner,
                                                 rbac.read_cluster_role(keeper.owner).metadata.uid)

        # Right as it is: not written again (a replica's look costs a GET and a LIST).
        assert keeper.round() == {k8s_namespace}
        assert admin.read_namespaced_config_map(name, k8s_namespace).metadata.resource_version == \
            stored.metadata.resource_version
        # Nobody can edit it, not even an admin: it is immutable.
        with pytest.raises(ApiException) as refused:
            admin.patch_namespaced_config_map(name, k8s_namespace, {"data": {"trainhook-launch": "#!/bin/sh\nevil\n"}})
        assert refused.value.status == 422 and "immutable" in refused.value.body
        # The attack left: delete it and create one's own under our name (immutable, our labels, even our owner).
        admin.delete_namespaced_config_map(name, k8s_namespace)
        impostor = lcm.configmap(name, k8s_namespace, deliver.build_zip(), "#!/bin/sh\necho evil\n")
        impostor["metadata"]["ownerReferences"] = [{"apiVersion": ref.api_version, "kind": ref.kind, "name": ref.name,
                                                    "uid": ref.uid}]
        admin.create_namespaced_config_map(k8s_namespace, impostor)
        assert keeper.round() == {k8s_namespace}
        assert any("content is not the launcher its name promises" in line for line in said)
        restored = admin.read_namespaced_config_map(name, k8s_namespace)
        assert base64.b64decode(restored.binary_data["trainhook-launch"]) == deliver.entry_program()
        assert restored.data is None and restored.immutable is True
        # A mutable one under our name (what the webhook wrote before it made them immutable) is replaced too.
        admin.delete_namespaced_config_map(name, k8s_namespace)
        mutable = lcm.configmap(name, k8s_namespace, deliver.build_zip(), deliver.entry_program())
        del mutable["immutable"]
        admin.create_namespaced_config_map(k8s_namespace, mutable)
        assert keeper.round() == {k8s_namespace}
        assert admin.read_namespaced_config_map(name, k8s_namespace).immutable is True


def test_a_namespace_created_after_the_install_is_served_once_an_upgrade_lists_it(control_plane, k8s_namespace,
                                                                                  launcher_rbac):
    """docs/operate/helm.md: each of trainingNamespaces must exist at install; one created later is added with
    `helm upgrade`, which creates its Role, and the upgraded webhook writes the ConfigMap there."""
    fullname, _, token, later = launcher_rbac
    with control_plane.api_client() as admin_client:
        admin, rbac = client.CoreV1Api(admin_client), client.RbacAuthorizationV1Api(admin_client)
        admin.create_namespace({"metadata": {"name": later}})
        # Before the upgrade the webhook has no right there (no ClusterRole on ConfigMaps): a webhook told to keep it
        # anyway is refused, names the fix, and leaves the namespace's pods to the init container.
        upgraded = render_chart({"fullnameOverride": fullname, "trainingNamespaces": [k8s_namespace, later]},
                                k8s_namespace)
        said: list[str] = []
        keeper = webhook_keeper(control_plane, token, [k8s_namespace, later], upgraded, said)
        assert keeper.round() == frozenset({k8s_namespace})
        assert len(said) == 1 and later in said[0] and "403" in said[0] and "init container" in said[0], said
        assert "trainingNamespaces" in said[0]
        assert not [c for c in admin.list_namespaced_config_map(later).items if c.metadata.name.startswith(lcm.PREFIX)]

        # The upgrade (trainingNamespaces now lists it) creates its Role and RoleBinding: served at the next round,
        # once the authorizer has seen them.
        create_launcher_roles(rbac, upgraded, [later])
        wait_for(f"the webhook to keep the launcher ConfigMap in {later}",
                 lambda: keeper.round() == {k8s_namespace, later}, timeout=30, interval=0.5)
        stored = admin.read_namespaced_config_map(keeper.name, later)
        assert stored.immutable is True
        assert base64.b64decode(stored.binary_data["trainhook-launch"]) == deliver.entry_program()
        [ref] = stored.metadata.owner_references
        assert (ref.kind, ref.name, ref.uid) == ("ClusterRole", keeper.owner,
                                                 rbac.read_cluster_role(keeper.owner).metadata.uid)


def test_old_versions_go_once_no_pod_mounts_them_and_helm_uninstall_leaves_none(control_plane, k8s_namespace,
                                                                               launcher_rbac):
    _, manifests, token, _ = launcher_rbac
    said: list[str] = []
    old = webhook_keeper(control_plane, token, [k8s_namespace], manifests, said, shim=deliver.SHIM + "# v1\n")
    new = webhook_keeper(control_plane, token, [k8s_namespace], manifests, said)
    assert old.name != new.name
    with control_plane.api_client() as admin_client:
        admin = client.CoreV1Api(admin_client)
        assert old.round() == {k8s_namespace}  # the previous version's webhook
        # Not ours to remove: another release's (another owner), and a ConfigMap of the team's own.
        someone_elses = lcm.configmap(lcm.PREFIX + "0123456789ab", k8s_namespace, b"x", "y")
        someone_elses["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Namespace", "name": "default",
                                                         "uid": admin.read_namespace("default").metadata.uid}]
        admin.create_namespaced_config_map(k8s_namespace, someone_elses)
        admin.create_namespaced_config_map(k8s_namespace, {"metadata": {"name": "team-config"}, "data": {"a": "b"}})
        # A gang pod admitted by the previous version, still waiting to start, mounts the old one.
        admin.create_namespaced_pod(k8s_namespace, {
            "metadata": {"name": "waiting", "labels": {"trainhook.dev/framework": "pytorch"}},
            "spec": {"containers": [{"name": "c", "image": "x"}], "volumes": [launcher_configmap_volume(old.name)]}})

        def names() -> set[str]:
            return {c.metadata.name for c in admin.list_namespaced_config_map(k8s_namespace).items}

        for _ in range(3):
            assert new.round() == {k8s_namespace}
        assert {old.name, new.name, someone_elses["metadata"]["name"], "team-config"} <= names()
        admin.delete_namespaced_pod("waiting", k8s_namespace, grace_period_seconds=0)
        wait_for("the pod to be gone", lambda: not admin.list_namespaced_pod(k8s_namespace).items)
        new.round()  # unmounted at one look: kept (a pod may be on its way)
        assert old.name in names()
        new.round()  # and at the next: removed
        assert old.name not in names()
        assert {new.name, someone_elses["metadata"]["name"], "team-config"} <= names()

        # helm uninstall deletes the release's ClusterRole: the garbage collector deletes the launcher ConfigMaps.
        client.RbacAuthorizationV1Api(admin_client).delete_cluster_role(new.owner)
        wait_for("the garbage collector to remove the launcher ConfigMap", lambda: new.name not in names(),
                 timeout=60)
        assert {someone_elses["metadata"]["name"], "team-config"} <= names()


def test_the_server_turns_ready_once_written_and_then_admits_with_the_configmap(control_plane, k8s_namespace,
                                                                                caplog):
    """keep_launcher_configmaps in a running aiohttp app: /readyz says why until the ConfigMaps are written, then
    the Settings every review reads name the ConfigMap and the namespaces where it is (and not those where it
    could not be written)."""
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from trainhook.webhook.background import keep_launcher_configmaps
    from trainhook.webhook.handlers import LIFECYCLE, SETTINGS, create_app
    from trainhook.webhook.settings import Settings

    caplog.set_level(logging.INFO, logger="trainhook.webhook")  # as the server logs: its records must build

    async def scenario():
        with control_plane.api_client() as api:
            app = create_app(Settings())
            keep_launcher_configmaps(app, api, (k8s_namespace, "no-such-namespace"), interval=0.2)
            assert app[LIFECYCLE].not_ready_reason() == "the launcher ConfigMaps are not written yet"
            async with TestClient(TestServer(app)) as http:
                for _ in range(100):
                    if (await http.get("/readyz")).status == 200:
                        break
                    await asyncio.sleep(0.1)
                assert (await http.get("/readyz")).status == 200
                current = app[SETTINGS].settings
                assert current.launcher_configmap == lcm.configmap_name(*lcm.content())
                assert current.launcher_namespaces == frozenset({k8s_namespace})
                await asyncio.sleep(0.5)  # later rounds keep it so
                assert app[SETTINGS].settings.launcher_namespaces == frozenset({k8s_namespace})
                listed = client.CoreV1Api(api).list_namespaced_config_map(k8s_namespace).items
                assert [c.metadata.name for c in listed if c.metadata.name.startswith(lcm.PREFIX)] == [
                    current.launcher_configmap]
    asyncio.run(scenario())
    [record] = [r for r in caplog.records if r.getMessage() == "launcher ConfigMap"]
    assert record.namespaces == [k8s_namespace] and record.configmap.startswith(lcm.PREFIX)


def test_replicas_writing_at_once_all_end_with_the_configmap(control_plane, k8s_namespace):
    """Two webhook replicas start together: both find no ConfigMap, both create it, one gets 409 AlreadyExists.
    Seen on the e2e node: that replica then served without the ConfigMap. Now both count it as kept."""
    import threading

    zip_bytes, shim = lcm.content()
    name = lcm.configmap_name(zip_bytes, shim)
    barrier, results, said = threading.Barrier(4), [], []

    class InStep(client.CoreV1Api):
        """Reads, then waits for the other replicas to have read too: every replica sees 404, then creates."""
        def read_namespaced_config_map(self, *args, **kwargs):
            try:
                return super().read_namespaced_config_map(*args, **kwargs)
            finally:
                try:
                    barrier.wait(timeout=5)
                except threading.BrokenBarrierError:
                    pass

    with control_plane.api_client() as api:
        def replica():
            results.append(lcm.publish(InStep(api), [k8s_namespace], name, zip_bytes, shim, said.append))
        threads = [threading.Thread(target=replica) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert results == [frozenset({k8s_namespace})] * 4, said
        assert said == []
        stored = client.CoreV1Api(api).read_namespaced_config_map(name, k8s_namespace)
        assert stored.data is None and base64.b64decode(stored.binary_data["trainhook-launch"]) == shim
