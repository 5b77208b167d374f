"""Self-managed certificates: the thin I/O edge around `trainhook.certs.lifecycle` (which decides everything).

Each replica, every `interval` seconds (jittered), runs `sync()`:
1. read the one Secret and the MutatingWebhookConfiguration;
2. `decide()` what the Secret should hold; write it if it changed: `create` (a 409 means another replica
   created it first: read it and decide again) or `update` with the resourceVersion read (a 409 means another
   replica rotated first: same). So two replicas always end up serving one Secret;
3. write the serving pair to `cert_dir` (an emptyDir; the root filesystem is read-only), where the server's
   reloader picks it up;
4. put the Secret's trust bundle into the caBundle of every webhook of the configuration, unless it is there
   (so a caBundle that something overwrote is put back within one interval);
5. make the configuration the Secret's owner (ownerReferences; a namespaced object may have a cluster-scoped
   owner), so `helm uninstall`, which deletes the configuration, lets the garbage collector delete the Secret and
   its CA key: no CA key outlives the release.

When the Secret is gone (deleted by hand, or by that garbage collector during a reinstall), `decide()` makes a new
CA and keeps the CAs the caBundle trusts today in the new bundle until every replica serves the new pair
(certs/lifecycle.py), so replicas still serving the old pair are not refused in between.

The API calls need (and the chart grants only): Secrets `create` in the namespace, `get`/`update` on the one
Secret, `get`/`patch` on the one MutatingWebhookConfiguration.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import datetime as dt
import json
import logging
import os
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509

from trainhook.gang import keys
from trainhook.certs import lifecycle
from trainhook.certs.build import CA_FILE, CERT_FILE, KEY_FILE
from trainhook.launcher.files import write_atomically

log = logging.getLogger("trainhook.webhook.certs")

# --- What the webhook writes on its Secret ---------------------------------------------------------------------
# Annotation: the last lifecycle action (create, rotate-ca, rotate-serving, prune) and why; for operators.
ACTION_ANNOTATION = keys.PREFIX + "cert-action"
# Annotation: the pod that wrote the Secret last, and when (RFC 3339).
WRITER_ANNOTATION = keys.PREFIX + "cert-written-by"
WRITTEN_AT_ANNOTATION = keys.PREFIX + "cert-written-at"
MANAGED_BY = "trainhook-webhook"
FIELD_MANAGER = "trainhook-webhook"
# A write lost to another replica is retried at once, this many times, before the sync gives up until the next.
MAX_CONFLICTS = 5
DEFAULT_INTERVAL = 60.0


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def kube_client() -> Any:
    """An API client: in-cluster (the pod's ServiceAccount token, re-read as the kubelet rotates it) when
    running in a pod, else the KUBECONFIG (development, tests)."""
    from kubernetes import client, config
    configuration = client.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)
    else:
        config.load_kube_config(client_configuration=configuration)
    return client.ApiClient(configuration)


def service_hostnames(service: str, namespace: str, cluster_domain: str) -> list[str]:
    """The names the API server may use for the Service: what the serving certificate must carry."""
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc",
            f"{service}.{namespace}.svc.{cluster_domain}"]


@dataclass(frozen=True)
class SyncReport:
    action: lifecycle.Action
    reason: str
    wrote_secret: bool
    patched_ca_bundle: bool
    conflicts: int


class Conflict(RuntimeError):
    """Another writer got there first (HTTP 409, or a JSON patch whose `test` failed)."""


class SelfManagedCerts:
    """One replica's view of the Secret and the webhook configuration. `trusted` holds the CAs that every
    webhook's caBundle held at the last look (None before the first)."""

    def __init__(self, api_client: Any, *, namespace: str, secret_name: str, webhook_config_name: str,
                 hostnames: list[str], cert_dir: str | Path, policy: lifecycle.Policy = lifecycle.Policy(),
                 clock: Callable[[], dt.datetime] = utc_now, identity: str = "") -> None:
        from kubernetes import client
        self.core = client.CoreV1Api(api_client)
        self.admission = client.AdmissionregistrationV1Api(api_client)
        self.namespace, self.secret_name, self.webhook_config_name = namespace, secret_name, webhook_config_name
        self.hostnames, self.policy, self.clock = list(hostnames), policy, clock
        self.identity = identity or os.uname().nodename
        self.cert_dir = Path(cert_dir)
        self.trusted: list[x509.Certificate] | None = None
        self.ca_bundle_in_place = False

    @property
    def cert_file(self) -> Path:
        return self.cert_dir / CERT_FILE

    @property
    def key_file(self) -> Path:
        return self.cert_dir / KEY_FILE

    def files_ready(self) -> bool:
        return self.cert_file.is_file() and self.key_file.is_file()

    # --- one pass ---------------------------------------------------------------------------------------------

    def sync(self) -> SyncReport:
        """Settle the Secret, write the serving pair, put the caBundle in place. Raises ApiException (and
        Conflict after MAX_CONFLICTS lost writes in a row); the next sync starts over."""
        conflicts = 0
        while True:
            secret = self._read_secret()
            config = self._read_config()
            if config is not None:
                self.trusted = lifecycle.trusted_everywhere(_ca_bundles(config))
            decision = lifecycle.decide(_secret_data(secret), self.hostnames, self.clock(), self.policy,
                                        None if config is None else self.trusted)
            if not decision.changed:
                break
            try:
                self._write_secret(secret, decision)
                break
            except Conflict:
                conflicts += 1
                if conflicts >= MAX_CONFLICTS:
                    raise
                log.info("another replica wrote the Secret first; reading it again",
                         extra={"secret": self.secret_name, "action": decision.action.value})
        if decision.changed:
            log.info("certificates %s: %s", decision.action.value, decision.reason,
                     extra={"secret": self.secret_name, "action": decision.action.value})
        self._write_files(decision.data)
        patched = self._ensure_ca_bundle(decision.data[CA_FILE])
        self._ensure_owner()
        return SyncReport(decision.action, decision.reason, decision.changed, patched, conflicts)

    # --- the Secret -------------------------------------------------------------------------------------------

    def _read_secret(self) -> dict | None:
        return _json_or_none(self.core.read_namespaced_secret, self.secret_name, self.namespace)

    def _write_secret(self, secret: dict | None, decision: lifecycle.Decision) -> None:
        annotations = {ACTION_ANNOTATION: f"{decision.action.value}: {decision.reason}",
                       WRITER_ANNOTATION: self.identity,
                       WRITTEN_AT_ANNOTATION: self.clock().strftime("%Y-%m-%dT%H:%M:%SZ")}
        data = {k: base64.b64encode(v).decode() for k, v in decision.data.items()}
        if secret is None:
            body = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                    "metadata": {"name": self.secret_name, "namespace": self.namespace,
                                 "labels": {"app.kubernetes.io/managed-by": MANAGED_BY,
                                            "app.kubernetes.io/part-of": "trainhook"},
                                 "annotations": annotations},
                    "data": data}
            _write(self.core.create_namespaced_secret, self.namespace, body)
            return
        metadata = secret["metadata"]
        body = {"apiVersion": "v1", "kind": "Secret", "type": secret.get("type", "Opaque"),
                "metadata": {"name": self.secret_name, "namespace": self.namespace,
                             "resourceVersion": metadata["resourceVersion"],
                             "labels": metadata.get("labels") or {},
                             "annotations": {**(metadata.get("annotations") or {}), **annotations}},
                # Keys we do not manage (someone else's) are kept.
                "data": {**(secret.get("data") or {}), **data}}
        _write(self.core.replace_namespaced_secret, self.secret_name, self.namespace, body)

    def _ensure_owner(self) -> None:
        """Make the webhook configuration the Secret's only owner (it may name a configuration of an earlier
        install, deleted since: that owner would get the Secret deleted under us). A lost race waits a sync."""
        config, secret = self._read_config(), self._read_secret()
        if config is None or secret is None:
            return
        owner = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                 "name": self.webhook_config_name, "uid": config["metadata"]["uid"]}
        refs = secret["metadata"].get("ownerReferences") or []
        if [(r.get("kind"), r.get("uid")) for r in refs] == [(owner["kind"], owner["uid"])]:
            return
        secret["metadata"]["ownerReferences"] = [owner]
        try:
            _write(self.core.replace_namespaced_secret, self.secret_name, self.namespace, secret)
        except Conflict:
            return
        log.info("the webhook configuration owns the Secret now", extra={"secret": self.secret_name})

    # --- the serving files ------------------------------------------------------------------------------------

    def _write_files(self, data: Mapping[str, bytes]) -> None:
        self.cert_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        for name in (CA_FILE, CERT_FILE, KEY_FILE):
            path = self.cert_dir / name
            if path.is_file() and path.read_bytes() == data[name]:
                continue
            write_atomically(path, data[name], 0o600)  # a reader sees the old file or the new one, never half

    # --- the caBundle -----------------------------------------------------------------------------------------

    def _read_config(self) -> dict | None:
        return _json_or_none(self.admission.read_mutating_webhook_configuration, self.webhook_config_name)

    def _ensure_ca_bundle(self, ca_pem: bytes) -> bool:
        """Put `ca_pem` into every webhook's caBundle unless it is there; True when it patched."""
        for _attempt in range(MAX_CONFLICTS):
            config = self._read_config()
            if config is None:
                self.ca_bundle_in_place = False
                raise LookupError(f"the MutatingWebhookConfiguration {self.webhook_config_name} does not exist "
                                  "(yet); its caBundle is written once it does")
            bundles = _ca_bundles(config)
            self.trusted = lifecycle.trusted_everywhere(bundles)
            if lifecycle.bundle_in_place(bundles, ca_pem):
                self.ca_bundle_in_place = True
                return False
            encoded = lifecycle.encode_ca_bundle(ca_pem)
            patch: list[dict] = []
            for index, webhook in enumerate(config.get("webhooks") or []):
                # `test` first: if the list changed since the read, the patch fails instead of landing on the
                # wrong webhook.
                patch += [{"op": "test", "path": f"/webhooks/{index}/name", "value": webhook["name"]},
                          {"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": encoded}]
            try:
                _write(self.admission.patch_mutating_webhook_configuration, self.webhook_config_name, patch,
                       conflicts=(409, 422))
            except Conflict:
                continue
            log.info("caBundle written", extra={"webhook_configuration": self.webhook_config_name,
                                                 "webhooks": len(patch) // 2,
                                                 "restored": any(bundles)})
            self.trusted = lifecycle.pem_certificates(ca_pem)
            self.ca_bundle_in_place = True
            return True
        raise Conflict(f"the MutatingWebhookConfiguration {self.webhook_config_name} kept changing")

    # --- readiness --------------------------------------------------------------------------------------------

    def not_ready_reason(self, serving: x509.Certificate | None) -> str | None:
        """Why the API server cannot call this replica successfully yet, or None."""
        if serving is None:
            return "no serving certificate loaded yet"
        if self.trusted is None:
            return f"the MutatingWebhookConfiguration {self.webhook_config_name} was not read yet"
        if not lifecycle.issued_by_any(serving, self.trusted):
            return f"the caBundle of {self.webhook_config_name} does not trust the serving certificate yet"
        return None

    # --- the loop ---------------------------------------------------------------------------------------------

    async def start(self, retry_max: float = 10.0) -> None:
        """Sync until the serving files exist (the server needs them to listen); a missing webhook
        configuration does not hold this up, the loop keeps trying."""
        delay = 0.5
        while True:
            try:
                await asyncio.to_thread(self.sync)
            except Exception as e:  # noqa: BLE001 - any failure is retried; the log says which
                log.warning("certificate sync failed; retrying", extra={"error": _describe(e), "retry_in": delay})
            if self.files_ready():
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, retry_max)

    async def run(self, interval: float = DEFAULT_INTERVAL, after_sync: Callable[[], object] = lambda: None,
                  jitter: float = 0.2, retry: float = 1.0) -> None:
        """Sync every `interval` seconds, ±`jitter` (so replicas do not write in lockstep), forever. Until the
        caBundle is in place (or after a failed sync), sooner: `retry` seconds, doubling up to `interval`."""
        failures = 0 if self.ca_bundle_in_place else 1
        while True:
            pause = interval if failures == 0 else min(retry * 2 ** (failures - 1), interval)
            await asyncio.sleep(pause * random.uniform(1 - jitter, 1 + jitter))
            try:
                await asyncio.to_thread(self.sync)
            except Exception as e:  # noqa: BLE001 - a failed sync is logged and retried
                log.warning("certificate sync failed", extra={"error": _describe(e)})
                failures += 1
            else:
                failures = 0 if self.ca_bundle_in_place else failures + 1
            finally:
                after_sync()


# --- API helpers (raw JSON: independent of the client's model classes and their versions) ----------------------

def _json_or_none(call: Callable[..., Any], *args: Any) -> dict | None:
    from kubernetes.client.rest import ApiException
    try:
        return json.loads(call(*args, _preload_content=False).data)
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def _write(call: Callable[..., Any], *args: Any, conflicts: tuple[int, ...] = (409,)) -> dict:
    """Call a create/update/patch; Conflict for the statuses that mean "someone else changed it first":
    409 for a create or an update, and for a JSON patch also 422 (a `test` failed or a path vanished: the
    webhook list changed under it)."""
    from kubernetes.client.rest import ApiException
    try:
        return json.loads(call(*args, field_manager=FIELD_MANAGER, _preload_content=False).data)
    except ApiException as e:
        if e.status in conflicts:
            raise Conflict(f"HTTP {e.status}: {e.reason}: {e.body}") from e
        raise


def _secret_data(secret: dict | None) -> dict[str, bytes]:
    """The Secret's data, decoded; a key whose value is not base64 counts as missing."""
    out: dict[str, bytes] = {}
    for name, value in ((secret or {}).get("data") or {}).items():
        try:
            out[name] = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            continue
    return out


def _ca_bundles(config: dict) -> list[str | None]:
    return [(w.get("clientConfig") or {}).get("caBundle") for w in config.get("webhooks") or []]


def _describe(error: BaseException) -> str:
    status = getattr(error, "status", None)
    if status == 403:
        return (f"forbidden (HTTP 403): the webhook's ServiceAccount lacks a permission the chart grants; "
                f"{getattr(error, 'body', '')}")
    return f"{type(error).__name__}: {error}"
