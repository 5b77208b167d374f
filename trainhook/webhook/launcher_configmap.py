"""The launcher as a ConfigMap in each training namespace: delivery without an init container.

An init container costs a gang's start more than anything else trainhook does: the kubelet starts the pod's
containers one after the other and notices that an init container has exited only at its next relist of the
runtime (every second on the kubelets we test), so the training container starts 1-1.5 s after the copy is done,
and the gang wait in it added its own half second (measured on the e2e node, docs/develop/performance.md). A ConfigMap
volume is written by the kubelet before any container starts. So where the webhook may keep one (the chart's
`trainingNamespaces`, where it binds the training role too), it writes the launcher's zip and entry point into
`trainhook-launcher-<hash>` once per namespace at startup, and pods there mount it at /trainhook instead of an
emptyDir filled by an init container. The launcher's own barrier (`trainhook-launch run` connects every member
to rank 0's coordinator before any training starts) is the gang wait.

The name carries a hash of the content, so a pod always mounts the launcher of the webhook that admitted it, and
two webhook versions side by side (a rolling upgrade) never overwrite each other's. The ConfigMap runs code in every
gang pod, so nobody else may change what it holds:
- it is `immutable: true`: its data cannot be edited, only the whole object deleted and created again;
- each round (`Keeper.round`, every minute) the webhook reads it back and checks that it is immutable and that its
  data hashes to the name; anything else (someone deleted it and created their own under our name) is deleted and
  written again, and until then the namespace's pods get the init container, never the impostor;
- old versions (our labels, another hash, owned by the same release) are deleted once no pod mounts them, at two
  rounds in a row (a pod admitted by the previous version may still be waiting to start);
- each is owned (ownerReferences) by the release's ClusterRole `<fullname>-launcher`, a cluster-scoped object:
  a namespaced dependent may have a cluster-scoped owner (ownerReferences cannot point across namespaces, and need
  not), so `helm uninstall` deleting that ClusterRole makes the garbage collector delete every launcher ConfigMap
  in every namespace, with no hook to run.

RBAC cannot limit `create` by name, nor `get`/`list`/`delete` to names not known when the chart is rendered (the
hash is the webhook image's), nor by label: the chart's Role in each of `trainingNamespaces` (never a ClusterRole:
that would reach kube-system's ConfigMaps) grants create/get/list/delete on ConfigMaps and list on Pods there, the
chart's ValidatingAdmissionPolicy keeps creates and deletes to `trainhook-launcher-*` where the API server serves
it, and this module is what limits the webhook to its own (the name prefix, its labels, its owner, a delete
precondition on the uid it checked).

Admission never calls the API: the namespaces where the ConfigMap was written and checked are in the Settings each
review reads. Elsewhere pods get the init container.
"""

from __future__ import annotations

import base64
import hashlib
import logging
from collections.abc import Callable, Iterable
from typing import Any

from trainhook.gang import keys
from trainhook.launcher import deliver
from trainhook.webhook.admission.delivery import LAUNCHER_CONFIGMAP_PREFIX as PREFIX, SHIM_KEY, ZIP_KEY

log = logging.getLogger("trainhook.webhook.launcher_configmap")

# The API server refuses a ConfigMap whose data and binaryData hold more than 1 MiB together (deliver.build_zip
# deflates the zip's bytecode where the entry program would not fit beside it stored).
MAX_BYTES = deliver.CONFIGMAP_BYTES
LABELS = {"app.kubernetes.io/name": "trainhook", "app.kubernetes.io/component": "launcher",
          "app.kubernetes.io/managed-by": "trainhook-webhook"}


def content() -> tuple[bytes, bytes]:
    """The zip and the entry point the init container would write (launcher/deliver.py), byte for byte: in the
    webhook's image the static program it was built with (so the ConfigMap's program is of the webhook image's
    architecture: docs/use/delivery.md)."""
    return deliver.build_zip(), deliver.entry_program()


def _as_bytes(entry: bytes | str) -> bytes:
    return entry.encode() if isinstance(entry, str) else entry


def configmap_name(zip_bytes: bytes, entry: bytes | str) -> str:
    digest = hashlib.sha256(zip_bytes + b"\0" + _as_bytes(entry)).hexdigest()[:12]
    return PREFIX + digest


def configmap(name: str, namespace: str, zip_bytes: bytes, entry: bytes | str) -> dict:
    """The entry point goes in binaryData when it is the program, in data (readable) when it is the script."""
    entry = _as_bytes(entry)
    binary = {ZIP_KEY: base64.b64encode(zip_bytes).decode()}
    body = {"apiVersion": "v1", "kind": "ConfigMap", "immutable": True,
            "metadata": {"name": name, "namespace": namespace, "labels": dict(LABELS)}, "binaryData": binary}
    if deliver.is_program(entry):
        binary[SHIM_KEY] = base64.b64encode(entry).decode()
    else:
        body["data"] = {SHIM_KEY: entry.decode()}
    return body


def content_digest(binary_data: dict | None, data: dict | None) -> str | None:
    """The hash our name carries, of a ConfigMap's launcher data as read back; None when the keys are not ours."""
    binary_data, data = binary_data or {}, data or {}
    if set(binary_data) | set(data) != {ZIP_KEY, SHIM_KEY} or ZIP_KEY not in binary_data or len(data) > 1:
        return None
    try:
        zip_bytes = base64.b64decode(binary_data[ZIP_KEY], validate=True)
        entry = data[SHIM_KEY].encode() if SHIM_KEY in data else base64.b64decode(binary_data[SHIM_KEY],
                                                                                 validate=True)
    except (ValueError, TypeError, AttributeError):
        return None
    return configmap_name(zip_bytes, entry)[len(PREFIX):]


class Keeper:
    """One replica's upkeep of the launcher ConfigMap `name` in `namespaces` (see the module docstring)."""

    def __init__(self, core_api: Any, namespaces: Iterable[str], zip_bytes: bytes, shim: bytes | str, *,
                 owner: str = "", rbac_api: Any = None, say: Callable[[str], None] = log.warning) -> None:
        self.core, self.rbac, self.owner, self.say = core_api, rbac_api, owner, say
        self.namespaces, self.zip_bytes, self.shim = tuple(namespaces), zip_bytes, shim
        self.name = configmap_name(zip_bytes, shim)
        self.unused: dict[str, set[str]] = {}  # namespace -> old versions no pod mounted at the last round

    def owner_reference(self) -> dict | None:
        """The release's ClusterRole as the owner, or None (said) when it cannot be read."""
        if not self.owner or self.rbac is None:
            return None
        from kubernetes.client.exceptions import ApiException
        try:
            role = self.rbac.read_cluster_role(self.owner)
        except ApiException as e:
            self.say(f"cannot read the ClusterRole {self.owner} that owns the launcher ConfigMaps ({e.status} "
                     f"{e.reason}); they are written without an owner, so helm uninstall will not remove them")
            return None
        return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "name": self.owner,
                "uid": role.metadata.uid}

    def round(self) -> frozenset[str]:
        """Write, check and tidy in every namespace; the namespaces whose pods may mount `name` now."""
        from kubernetes.client.exceptions import ApiException
        owner, done = self.owner_reference(), set()
        for namespace in self.namespaces:
            try:
                self.keep(namespace, owner)
            except ApiException as e:
                self.say(f"cannot keep the launcher ConfigMap {namespace}/{self.name} ({e.status} {e.reason}); pods "
                         f"in {namespace} get the launcher from the gang-wait init container instead (slower to "
                         f"start): create the namespace and list it in the chart's trainingNamespaces (its Role there "
                         f"gives the webhook's ServiceAccount create/get/list/delete on configmaps)")
                continue
            done.add(namespace)
            try:
                self.tidy(namespace, owner)
            except ApiException as e:
                self.say(f"cannot remove old launcher ConfigMaps in {namespace} ({e.status} {e.reason})")
        return frozenset(done)

    def keep(self, namespace: str, owner: dict | None) -> None:
        """Make sure our ConfigMap in `namespace` is there, immutable, holds our launcher and has our owner."""
        from kubernetes.client.exceptions import ApiException
        wanted = self.name[len(PREFIX):]
        for _ in range(3):  # the replicas start together: another may create it meanwhile
            try:
                current = self.core.read_namespaced_config_map(self.name, namespace)
            except ApiException as e:
                if e.status != 404:
                    raise
                current = None
            if current is not None:
                owners = {ref.uid for ref in current.metadata.owner_references or []}
                problem = ("it is not immutable" if current.immutable is not True else
                           "its content is not the launcher its name promises"
                           if content_digest(current.binary_data, current.data) != wanted else
                           "it is owned by another (an uninstalled) release" if owner and owner["uid"] not in owners
                           else None)
                if problem is None:
                    return
                self.say(f"the launcher ConfigMap {namespace}/{self.name} is not ours as written: {problem}; "
                         "deleting it and writing ours (its pods get the init container meanwhile)")
                self.delete(namespace, current)
            body = configmap(self.name, namespace, self.zip_bytes, self.shim)
            if owner:
                body["metadata"]["ownerReferences"] = [owner]
            try:
                self.core.create_namespaced_config_map(namespace, body)
                return
            except ApiException as e:
                if e.status != 409:
                    raise
        raise ApiException(status=409, reason="Conflict: changed by someone else three times in a row")

    def delete(self, namespace: str, current: Any) -> None:
        """Delete the very object we looked at (uid and resourceVersion preconditions); gone already is fine."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException
        meta = current.metadata
        try:
            self.core.delete_namespaced_config_map(meta.name, namespace, body=client.V1DeleteOptions(
                preconditions=client.V1Preconditions(uid=meta.uid, resource_version=meta.resource_version)))
        except ApiException as e:
            if e.status not in (404, 409):
                raise

    def tidy(self, namespace: str, owner: dict | None) -> None:
        """Delete our old versions in `namespace` that no pod has mounted at this round and the last one."""
        selector = ",".join(f"{k}={v}" for k, v in LABELS.items())
        old = {}
        for item in self.core.list_namespaced_config_map(namespace, label_selector=selector).items:
            owners = {ref.uid for ref in item.metadata.owner_references or []}
            # ours: our prefix and labels, and our release's (or, written before owners were set, nobody's)
            if (item.metadata.name.startswith(PREFIX) and item.metadata.name != self.name
                    and (not owners or (owner is not None and owner["uid"] in owners))):
                old[item.metadata.name] = item
        if not old:
            self.unused.pop(namespace, None)
            return
        mounted = set()
        for pod in self.core.list_namespaced_pod(namespace, label_selector=keys.FRAMEWORK).items:
            for vol in pod.spec.volumes or []:
                if vol.config_map is not None:
                    mounted.add(vol.config_map.name)
        unused = set(old) - mounted
        for name in sorted(unused & self.unused.get(namespace, set())):
            self.delete(namespace, old[name])
            log.info("old launcher ConfigMap removed", extra={"namespace": namespace, "configmap": name})
            unused.discard(name)
        self.unused[namespace] = unused


def publish(core_api: Any, namespaces: Iterable[str], name: str, zip_bytes: bytes, shim: bytes | str,
            say: Callable[[str], None] = log.warning) -> frozenset[str]:
    """One round without an owner (tests, tools): the namespaces where ConfigMap `name` holds the launcher."""
    keeper = Keeper(core_api, namespaces, zip_bytes, shim, say=say)
    assert keeper.name == name, f"{name} is not the name of this content ({keeper.name})"
    return keeper.round()
