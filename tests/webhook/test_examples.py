"""Every example manifest: valid Kubernetes, scripts in sync with their ConfigMaps, and mutation idempotent for
every object and every pod the controllers would create."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from trainhook.local.controllers import job_pods, statefulset_pods
from trainhook.webhook.admission.mutate import mutate
from trainhook.webhook.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in (ROOT / "examples").rglob("*.yaml"))
SETTINGS = Settings(gang_key=b"examples", notary_url="https://trainhook.trainhook.svc:8444", notary_ca="PEM")
WORKLOADS = ("StatefulSet", "Job", "Pod", "Service")


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_there_are_examples_for_every_framework():
    folders = {p.parent.name for p in EXAMPLES}
    assert {"pytorch", "tensorflow", "xgboost", "jax", "paddle"} <= folders


@pytest.mark.parametrize("path", EXAMPLES, ids=[str(p.relative_to(ROOT)) for p in EXAMPLES])
def test_example_objects_are_valid_kubernetes(path):
    for doc in documents(path):
        if doc["apiVersion"].split("/")[0] in ("v1", "apps", "batch", "rbac.authorization.k8s.io"):
            kubernetes_validate.validate(doc, "1.33.0", strict=True)


@pytest.mark.parametrize("path", EXAMPLES, ids=[str(p.relative_to(ROOT)) for p in EXAMPLES])
def test_scripts_in_configmaps_equal_their_source_files(path):
    for doc in documents(path):
        if doc["kind"] == "ConfigMap":
            for name, text in (doc.get("data") or {}).items():
                source = path.parent / name
                if source.exists():
                    assert text == source.read_text(), f"{path.name}: ConfigMap copy of {name} is stale"


@pytest.mark.parametrize("path", EXAMPLES, ids=[str(p.relative_to(ROOT)) for p in EXAMPLES])
def test_mutating_twice_equals_mutating_once_for_every_object_and_pod(path):
    admitted = []
    for doc in documents(path):
        if doc["kind"] not in WORKLOADS:
            continue
        doc["metadata"].setdefault("namespace", "default")
        namespace = doc["metadata"]["namespace"]
        once = mutate(doc["kind"], "CREATE", doc, namespace, SETTINGS).obj
        assert mutate(doc["kind"], "CREATE", once, namespace, SETTINGS).obj == once
        admitted.append(once)
    for workload in admitted:
        if workload["kind"] in ("StatefulSet", "Job"):
            for pod in (statefulset_pods if workload["kind"] == "StatefulSet" else job_pods)(workload):
                namespace = pod["metadata"].get("namespace", "default")
                once = mutate("Pod", "CREATE", pod, namespace, SETTINGS).obj
                assert mutate("Pod", "CREATE", once, namespace, SETTINGS).obj == once
