"""The launcher as a ConfigMap in each training namespace: delivery without an init container.

An init container costs a gang's start more than anything else trainhook does: the kubelet starts the pod's
containers one after the other and notices that an init container has exited only at its next relist of the
runtime (every second on the kubelets we test), so the training container starts 1-1.5 s after the copy is done,
and the gang wait in it added its own half second (measured on the e2e node, docs/performance.md). A ConfigMap
volume is written by the kubelet before any container starts. So where the webhook may keep one (the chart's
`trainingNamespaces`, where it binds the training role too), it writes the launcher's zip and shim into
`trainhook-launcher-<hash>` once per namespace at startup, and pods there mount it at /trainhook instead of an
emptyDir filled by an init container. The launcher's own barrier (`trainhook-launch run` connects every member
to rank 0's coordinator before any training starts) is the gang wait.

The name carries a hash of the content, so a pod always mounts the launcher of the webhook that admitted it, and
two webhook versions side by side (a rolling upgrade) never overwrite each other's. Older ones are left in place:
pods admitted by the previous version may still be starting (each is about 110 KB).

Admission never calls the API: the namespaces where the ConfigMap was written (at startup, and again every few
minutes in case someone deleted it) are in the Settings each review reads. Elsewhere pods get the init container.
"""

from __future__ import annotations

import base64
import hashlib
import logging
from typing import Any, Callable, Iterable

from trainhook import keys
from trainhook.launcher import deliver

log = logging.getLogger("trainhook.webhook.launcher_configmap")

PREFIX = "trainhook-launcher-"
ZIP_KEY, SHIM_KEY = deliver.ZIP_NAME, deliver.SHIM_NAME  # ConfigMap keys cannot hold a '/': items map them
LABELS = {"app.kubernetes.io/name": "trainhook", "app.kubernetes.io/component": "launcher",
          "app.kubernetes.io/managed-by": "trainhook-webhook"}


def content() -> tuple[bytes, str]:
    """The zip and the shim the init container would write (launcher/deliver.py), byte for byte."""
    return deliver.build_zip(), deliver.SHIM


def configmap_name(zip_bytes: bytes, shim: str) -> str:
    digest = hashlib.sha256(zip_bytes + b"\0" + shim.encode()).hexdigest()[:12]
    return PREFIX + digest


def configmap(name: str, namespace: str, zip_bytes: bytes, shim: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(LABELS)},
            "binaryData": {ZIP_KEY: base64.b64encode(zip_bytes).decode()},
            "data": {SHIM_KEY: shim}}


def volume(name: str) -> dict:
    """The pod's launcher volume: the zip and bin/trainhook-launch, as the init container lays them out."""
    return {"name": keys.LAUNCHER_VOLUME, "configMap": {"name": name, "items": [
        {"key": ZIP_KEY, "path": ZIP_KEY, "mode": 0o444},
        {"key": SHIM_KEY, "path": f"bin/{SHIM_KEY}", "mode": 0o555}]}}


def is_ours(volume_spec: dict) -> bool:
    """Whether a volume named keys.LAUNCHER_VOLUME is the one we deliver (an emptyDir, or our ConfigMap)."""
    if volume_spec.get("emptyDir") is not None:
        return True
    source = volume_spec.get("configMap")
    return isinstance(source, dict) and str(source.get("name", "")).startswith(PREFIX)


def publish(core_api: Any, namespaces: Iterable[str], name: str, zip_bytes: bytes, shim: str,
            say: Callable[[str], None] = log.warning) -> frozenset[str]:
    """Make sure ConfigMap `name` holds the launcher in each namespace; the namespaces where it does. A namespace
    where it cannot be written (missing, forbidden) is left out and named, and its pods get the init container."""
    from kubernetes.client.exceptions import ApiException

    def keep(namespace: str, body: dict) -> None:
        for _ in range(3):  # the webhook's replicas start together: another may create or replace it meanwhile
            try:
                current = core_api.read_namespaced_config_map(name, namespace)
            except ApiException as e:
                if e.status != 404:
                    raise
                current = None
            try:
                if current is None:
                    core_api.create_namespaced_config_map(namespace, body)
                elif current.binary_data != body["binaryData"] or current.data != body["data"]:
                    body["metadata"]["resourceVersion"] = current.metadata.resource_version
                    core_api.replace_namespaced_config_map(name, namespace, body)
                return
            except ApiException as e:
                if e.status != 409:  # 409: created or changed by another replica since we read it; read again
                    raise
        raise ApiException(status=409, reason="Conflict: changed by someone else three times in a row")

    done = set()
    for namespace in namespaces:
        try:
            keep(namespace, configmap(name, namespace, zip_bytes, shim))
        except ApiException as e:
            say(f"cannot keep the launcher ConfigMap {namespace}/{name} ({e.status} {e.reason}); pods in "
                f"{namespace} get the launcher from the gang-wait init container instead (slower to start): "
                f"create the namespace, or give the webhook's ServiceAccount get/create/update on configmaps there "
                f"(the chart does for its trainingNamespaces)")
            continue
        done.add(namespace)
    return frozenset(done)
