"""The webhook keeps the launcher ConfigMap on a real API server (v1.20), as the chart's ServiceAccount and with
only the Role the chart gives it in the training namespaces: created once, left alone while it is right, put back
when changed, and a namespace it may not write to is named and left to the init container."""

from __future__ import annotations

import base64
import logging
import uuid

import pytest
from kubernetes import client

from chart_render import find, find_all, render_chart
from conftest_cluster import control_plane, k8s_namespace, wait_for_service_account_token  # noqa: F401
from trainhook.launcher import deliver
from trainhook.webhook import launcher_configmap as lcm

pytestmark = pytest.mark.cluster


def test_the_webhook_keeps_the_launcher_configmap_with_only_the_charts_role(control_plane, k8s_namespace):
    fullname = f"th-{uuid.uuid4().hex[:8]}"
    manifests = render_chart({"fullnameOverride": fullname, "trainingNamespaces": [k8s_namespace]}, k8s_namespace)
    roles = [m for m in find_all(manifests, "Role") + find_all(manifests, "RoleBinding")
             if m["metadata"]["labels"]["app.kubernetes.io/component"] == "launcher"]
    assert sorted(m["kind"] for m in roles) == ["Role", "RoleBinding"]
    zip_bytes, shim = lcm.content()
    name = lcm.configmap_name(zip_bytes, shim)
    with control_plane.api_client() as admin_client:
        admin, rbac = client.CoreV1Api(admin_client), client.RbacAuthorizationV1Api(admin_client)
        admin.create_namespaced_service_account(k8s_namespace, find(manifests, "ServiceAccount"))
        rbac.create_namespaced_role(k8s_namespace, find(roles, "Role"))
        rbac.create_namespaced_role_binding(k8s_namespace, find(roles, "RoleBinding"))
        token = wait_for_service_account_token(admin_client, k8s_namespace,
                                               find(manifests, "ServiceAccount")["metadata"]["name"])
        said: list[str] = []
        with control_plane.token_client(token) as webhook_client:
            core = client.CoreV1Api(webhook_client)
            # kube-system: a namespace the chart gave it no Role in.
            done = lcm.publish(core, [k8s_namespace, "kube-system"], name, zip_bytes, shim, said.append)
            assert done == frozenset({k8s_namespace})
            assert len(said) == 1 and "kube-system" in said[0] and "403" in said[0] and "init container" in said[0]

            stored = admin.read_namespaced_config_map(name, k8s_namespace)
            assert base64.b64decode(stored.binary_data["launcher.pyz"]) == deliver.build_zip()
            assert stored.data == {"trainhook-launch": deliver.SHIM}
            assert stored.metadata.labels["app.kubernetes.io/managed-by"] == "trainhook-webhook"

            # Right as it is: not written again (a replica's periodic look costs one GET).
            assert lcm.publish(core, [k8s_namespace], name, zip_bytes, shim, said.append) == {k8s_namespace}
            assert admin.read_namespaced_config_map(name, k8s_namespace).metadata.resource_version == \
                stored.metadata.resource_version
            # Changed by someone: put back.
            admin.patch_namespaced_config_map(name, k8s_namespace, {"data": {"trainhook-launch": "#!/bin/sh\n"}})
            assert lcm.publish(core, [k8s_namespace], name, zip_bytes, shim, said.append) == {k8s_namespace}
            assert admin.read_namespaced_config_map(name, k8s_namespace).data == {"trainhook-launch": deliver.SHIM}
            # Deleted by someone: created again.
            admin.delete_namespaced_config_map(name, k8s_namespace)
            assert lcm.publish(core, [k8s_namespace], name, zip_bytes, shim, said.append) == {k8s_namespace}
            assert admin.read_namespaced_config_map(name, k8s_namespace).data == {"trainhook-launch": deliver.SHIM}
            assert len(said) == 1


def test_the_server_turns_ready_once_written_and_then_admits_with_the_configmap(control_plane, k8s_namespace,
                                                                                caplog):
    """keep_launcher_configmaps in a running aiohttp app: /readyz says why until the ConfigMaps are written, then
    the Settings every review reads name the ConfigMap and the namespaces where it is (and not those where it
    could not be written)."""
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from trainhook.webhook import server
    from trainhook.webhook.settings import Settings

    caplog.set_level(logging.INFO, logger="trainhook.webhook")  # as the server logs: its records must build

    async def scenario():
        with control_plane.api_client() as api:
            app = server.create_app(Settings())
            server.keep_launcher_configmaps(app, api, (k8s_namespace, "no-such-namespace"), interval=0.2)
            assert app[server.LIFECYCLE].not_ready_reason() == "the launcher ConfigMaps are not written yet"
            async with TestClient(TestServer(app)) as http:
                for _ in range(100):
                    if (await http.get("/readyz")).status == 200:
                        break
                    await asyncio.sleep(0.1)
                assert (await http.get("/readyz")).status == 200
                current = app[server.SETTINGS].settings
                assert current.launcher_configmap == lcm.configmap_name(*lcm.content())
                assert current.launcher_namespaces == frozenset({k8s_namespace})
                await asyncio.sleep(0.5)  # later rounds keep it so
                assert app[server.SETTINGS].settings.launcher_namespaces == frozenset({k8s_namespace})
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
        assert client.CoreV1Api(api).read_namespaced_config_map(name, k8s_namespace).data == {
            "trainhook-launch": deliver.SHIM}
