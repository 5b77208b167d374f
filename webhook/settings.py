"""The webhook's settings, from flags or TRAINHOOK_WEBHOOK_* environment (the chart sets the environment)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

DEFAULT_LAUNCHER_IMAGE = "ghcr.io/trainhook/launcher:0.1.0"


@dataclass(frozen=True)
class Settings:
    """What a mutation depends on besides the object itself; immutable, so concurrent reviews share it safely."""

    launcher_image: str = DEFAULT_LAUNCHER_IMAGE
    # Tolerations added to every training pod (the chart's `tolerations` value), as Kubernetes dicts.
    extra_tolerations: tuple[dict, ...] = ()
    cluster_domain: str = "cluster.local"
    # Seconds the gang-wait init container waits for peers before failing with the names still missing.
    wait_timeout: int = 600
    # Resources of the gang-wait init container (small: it only resolves names and opens sockets).
    init_resources: dict = field(default_factory=lambda: {
        "requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"cpu": "100m", "memory": "128Mi"}})


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
    return tuple(value)


def settings_from_env(environ: dict[str, str] | None = None) -> dict:
    """Settings named in the environment (TRAINHOOK_WEBHOOK_*), as keyword arguments for `Settings`."""
    env = os.environ if environ is None else environ
    found: dict = {}
    if "TRAINHOOK_WEBHOOK_LAUNCHER_IMAGE" in env:
        found["launcher_image"] = env["TRAINHOOK_WEBHOOK_LAUNCHER_IMAGE"]
    if "TRAINHOOK_WEBHOOK_TOLERATIONS" in env:
        found["extra_tolerations"] = parse_tolerations(env["TRAINHOOK_WEBHOOK_TOLERATIONS"])
    if "TRAINHOOK_WEBHOOK_CLUSTER_DOMAIN" in env:
        found["cluster_domain"] = env["TRAINHOOK_WEBHOOK_CLUSTER_DOMAIN"]
    if "TRAINHOOK_WEBHOOK_WAIT_TIMEOUT" in env:
        found["wait_timeout"] = int(env["TRAINHOOK_WEBHOOK_WAIT_TIMEOUT"])
    return found
