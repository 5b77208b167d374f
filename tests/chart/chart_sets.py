"""The chart's value sets that the chart room renders, and small readers of rendered manifests, shared by
test_chart.py and test_chart_rbac.py (conftest.py renders every set once per session: the `rendered` fixture)."""

from __future__ import annotations

import base64
import copy
import datetime as dt
from pathlib import Path

import yaml

from chart_render import find
from trainhook.certs.build import build_ca

DATA = Path(__file__).parent / "data"
FULL_VALUES_FILE = DATA / "values-full.yaml"
FULL = yaml.safe_load(FULL_VALUES_FILE.read_text())
NAMESPACE = "ml-platform"
CA_PEM = build_ca("trainhook-test-ca", dt.datetime.now(dt.timezone.utc)).cert_pem.decode()


def merged(base: dict, override: dict) -> dict:
    """`override` deep-merged over `base`, as Helm merges values files."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


SECRET_MODE = {"certificates": {"mode": "secret", "secretName": "user-tls", "caBundle": CA_PEM}}
VALUE_SETS: dict[str, dict] = {
    "self-managed": {},
    "self-managed-full": FULL,
    "cert-manager": {"certificates": {"mode": "cert-manager"}},
    "cert-manager-full": merged(FULL, {"certificates": {"mode": "cert-manager", "certManager": {
        "issuerRef": {"name": "corporate-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}}}}),
    "secret": SECRET_MODE,
    # The caBundle as base64 of the PEM this time, and a Secret name of the user's.
    "secret-full": merged(FULL, {"certificates": {"mode": "secret", "secretName": "corp-issued-tls",
                                                  "caBundle": base64.b64encode(CA_PEM.encode()).decode()}}),
    "single-replica": {"replicaCount": 1},
}
MODE_OF = {name: merged({"certificates": {"mode": "self-managed"}}, values)["certificates"]["mode"]
           for name, values in VALUE_SETS.items()}


def value_sets(mode: str | None = None) -> list[str]:
    return [name for name in VALUE_SETS if mode is None or MODE_OF[name] == mode]


def webhook_container(manifests: list[dict]) -> dict:
    deployment = find(manifests, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def literal_env(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def rules_of(manifests: list[dict], kind: str, name: str) -> list[dict]:
    return find(manifests, kind, name)["rules"]


def find_secret_volume(manifests: list[dict]) -> dict:
    deployment = find(manifests, "Deployment")
    (mount,) = [m for m in webhook_container(manifests)["volumeMounts"] if m["mountPath"] == "/tls"]
    assert mount["readOnly"] is True and "subPath" not in mount  # subPath mounts never see a rotated Secret
    (volume,) = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
    return volume["secret"]
