"""The webhook's settings, from flags or TRAINHOOK_WEBHOOK_* environment (the chart sets the environment)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from trainhook.webhook.admission.resources import parse_wait_resources
from trainhook.webhook.admission.tolerations import check_entries, parse_namespaces as parse_toleration_namespaces

DEFAULT_LAUNCHER_IMAGE = "ghcr.io/trainhook/launcher:0.1.0"


@dataclass(frozen=True)
class Settings:
    """What a mutation depends on besides the object itself; immutable, so concurrent reviews share it safely."""

    launcher_image: str = DEFAULT_LAUNCHER_IMAGE
    # The chart's `tolerations` value, as Kubernetes dicts (an entry may carry trainhook's `requiresResource`), and
    # the namespaces whose training pods get them (`tolerationNamespaces`; `*`: every one; empty: none):
    # webhook/admission/tolerations.py decides which a pod gets.
    extra_tolerations: tuple[dict, ...] = ()
    toleration_namespaces: frozenset = frozenset()
    cluster_domain: str = "cluster.local"
    # Seconds the gang-wait init container waits for peers before failing with the names still missing.
    wait_timeout: int = 600
    # The chart's gangWaitResources: the gang-wait init container's resources ({}: the defaults of
    # webhook/admission/resources.py's wait_resources, which also says how a Guaranteed pod keeps its class).
    wait_resources: dict = field(default_factory=dict)
    # The key each gang's token is derived from (HMAC of namespace/job-name): only the webhook holds it, so
    # no one outside a gang can forge its launchers' completion or failure messages. Every replica must share
    # it (the chart keeps it in a Secret); empty means no token is injected.
    gang_key: bytes = b""
    # Users besides kube-controller-manager's own that may create a StatefulSet's or Job's gang pods (a cluster
    # whose controller-manager runs as another user; webhook/admission/provenance.py).
    controller_users: tuple[str, ...] = ()
    # The launcher ConfigMap (webhook/launcher_configmap.py) and the namespaces where the server has written it:
    # pods there mount it instead of getting the launcher from an init container. Empty until it is written.
    launcher_configmap: str = ""
    launcher_namespaces: frozenset = frozenset()
    # The notary (docs/operate/security.md, webhook/notary/service.py): its base URL as gang pods dial it
    # (`https://<service>.<namespace>.svc:<port>`; empty when this webhook runs no notary, and then nothing is
    # injected), and the PEM CA bundle that verifies its certificate. `notary_ca` is either the PEM itself (a str:
    # the chart's caBundle in certificate mode `secret`) or a function returning the current PEM (self-managed and
    # cert-manager, whose CA file can rotate): read it through `notary_ca_pem`, which makes no API call.
    notary_url: str = ""
    notary_ca: Callable[[], str] | str = ""


def notary_ca_pem(settings: Settings) -> str:
    """The notary's CA bundle now (PEM text, "" when unknown), whichever form `settings.notary_ca` has."""
    ca = settings.notary_ca
    return ca() if callable(ca) else ca


def parse_tolerations(text: str) -> tuple[dict, ...]:
    """Tolerations as a JSON list of Kubernetes toleration objects; raises ValueError with the reason."""
    if not text.strip():
        return ()
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"extra tolerations are not JSON: {e}") from e
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise ValueError("extra tolerations must be a JSON list of toleration objects")
    check_entries(value)
    return tuple(value)


def parse_namespaces(text: str) -> tuple[str, ...]:
    """Comma-separated namespace names (the chart's trainingNamespaces)."""
    return tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))


def settings_from_env(environ: dict[str, str] | None = None) -> dict:
    """Settings named in the environment (TRAINHOOK_WEBHOOK_*), as keyword arguments for `Settings`."""
    env = os.environ if environ is None else environ
    found: dict = {}
    if "TRAINHOOK_WEBHOOK_LAUNCHER_IMAGE" in env:
        found["launcher_image"] = env["TRAINHOOK_WEBHOOK_LAUNCHER_IMAGE"]
    if "TRAINHOOK_WEBHOOK_TOLERATIONS" in env:
        found["extra_tolerations"] = parse_tolerations(env["TRAINHOOK_WEBHOOK_TOLERATIONS"])
    if "TRAINHOOK_WEBHOOK_TOLERATION_NAMESPACES" in env:
        found["toleration_namespaces"] = parse_toleration_namespaces(env["TRAINHOOK_WEBHOOK_TOLERATION_NAMESPACES"])
    if "TRAINHOOK_WEBHOOK_CLUSTER_DOMAIN" in env:
        found["cluster_domain"] = env["TRAINHOOK_WEBHOOK_CLUSTER_DOMAIN"]
    if "TRAINHOOK_WEBHOOK_GANG_WAIT_RESOURCES" in env:
        found["wait_resources"] = parse_wait_resources(env["TRAINHOOK_WEBHOOK_GANG_WAIT_RESOURCES"])
    if "TRAINHOOK_WEBHOOK_WAIT_TIMEOUT" in env:
        found["wait_timeout"] = int(env["TRAINHOOK_WEBHOOK_WAIT_TIMEOUT"])
    if env.get("TRAINHOOK_WEBHOOK_CONTROLLER_USERS"):
        found["controller_users"] = tuple(u.strip() for u in env["TRAINHOOK_WEBHOOK_CONTROLLER_USERS"].split(",")
                                          if u.strip())
    if env.get("TRAINHOOK_WEBHOOK_GANG_KEY"):
        found["gang_key"] = env["TRAINHOOK_WEBHOOK_GANG_KEY"].encode()
    return found


# --- Certificates (how the server gets the certificate it serves; nothing a mutation depends on) ------------
CERT_MODES = ("self-managed", "cert-manager", "secret")
# Where the self-managed mode writes the serving pair it keeps in its Secret: in the chart, the pod's /tmp
# emptyDir (the root filesystem is read-only).
DEFAULT_CERT_DIR = "/tmp/trainhook-certs"


@dataclass(frozen=True)
class CertSettings:
    """Where the serving certificate comes from. `cert-manager` and `secret` serve the files `cert_file` and
    `key_file` (a mounted Secret); `self-managed` keeps a CA and serving pair in the Secret `secret_name`
    itself, serves them from `cert_dir`, and keeps the caBundle of `webhook_config_name` in place."""

    mode: str = "secret"
    cert_file: str | None = None
    key_file: str | None = None
    # Seconds between two looks at the certificate files (a changed pair is served without a restart).
    reload_interval: float = 3.0
    # self-managed only:
    secret_name: str = ""
    webhook_config_name: str = ""
    service_name: str = ""
    namespace: str = ""
    pod_name: str = ""
    cert_dir: str = DEFAULT_CERT_DIR
    # More names for the serving certificate besides the Service's (e.g. an IP, for a webhook called by URL).
    extra_sans: tuple[str, ...] = ()
    # Seconds between two syncs of the Secret and the caBundle (jittered by ±20%).
    sync_interval: float = 60.0

    def missing(self) -> list[str]:
        """The settings the mode needs and does not have, as the flags that set them."""
        if self.mode != "self-managed":
            return [flag for flag, value in (("--tls-cert", self.cert_file), ("--tls-key", self.key_file))
                    if not value]
        return [flag for flag, value in (("--secret-name", self.secret_name),
                                         ("--webhook-config-name", self.webhook_config_name),
                                         ("--service-name", self.service_name),
                                         ("--namespace", self.namespace)) if not value]


# Environment variables (set by the chart) for the certificate flags, by CertSettings field.
CERT_ENV = {
    "mode": "TRAINHOOK_WEBHOOK_CERT_MODE",
    "secret_name": "TRAINHOOK_WEBHOOK_SECRET_NAME",
    "webhook_config_name": "TRAINHOOK_WEBHOOK_WEBHOOK_CONFIG_NAME",
    "service_name": "TRAINHOOK_WEBHOOK_SERVICE_NAME",
    "namespace": "TRAINHOOK_WEBHOOK_NAMESPACE",
    "pod_name": "TRAINHOOK_WEBHOOK_POD_NAME",
    "cert_dir": "TRAINHOOK_WEBHOOK_CERT_DIR",
    "extra_sans": "TRAINHOOK_WEBHOOK_EXTRA_SANS",
    "reload_interval": "TRAINHOOK_WEBHOOK_TLS_RELOAD_INTERVAL",
    "sync_interval": "TRAINHOOK_WEBHOOK_CERT_SYNC_INTERVAL",
}


def cert_settings_from_env(environ: dict[str, str] | None = None) -> dict:
    """Certificate settings named in the environment, as keyword arguments for `CertSettings`."""
    env = os.environ if environ is None else environ
    found: dict = {}
    for name, variable in CERT_ENV.items():
        if variable not in env:
            continue
        value = env[variable]
        if name == "extra_sans":
            found[name] = parse_sans(value)
        elif name in ("reload_interval", "sync_interval"):
            found[name] = float(value)
        else:
            found[name] = value
    return found


def parse_sans(text: str) -> tuple[str, ...]:
    """Comma-separated DNS names or IPs."""
    return tuple(name.strip() for name in text.split(",") if name.strip())
