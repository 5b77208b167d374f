"""Rendered manifests checked as the API server would: Kubernetes kinds under kubernetes-validate --strict, the
schedulers' PodGroups under their published CRD schemas (kept in tests/support/data/scheduling/). Shared by the
tests of `trainhook render`, convert and the SDK (tests/cli/) and the rendered examples on a real API server
(tests/cluster/test_render_scheduling.py).
"""

from __future__ import annotations

import copy
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from trainhook.render import RenderOptions

SCHEDULING_DATA = Path(__file__).resolve().parent / "data" / "scheduling"
# The schedulers' PodGroup CRDs, kept as test data (transcribed from their published CRD YAML).
PODGROUP_CRDS = {
    "scheduling.volcano.sh/v1beta1": SCHEDULING_DATA / "volcano-podgroup-crd.yaml",
    "scheduling.x-k8s.io/v1alpha1": SCHEDULING_DATA / "coscheduling-podgroup-crd.yaml",
}
KUBERNETES_VERSION = "1.33.0"


def strict(schema: dict) -> dict:
    """A CRD's structural schema as JSON Schema that refuses unknown fields (the API server prunes them
    silently, which for a manifest generator is a bug all the same)."""
    schema = copy.deepcopy(schema)
    if "properties" in schema and "additionalProperties" not in schema:
        schema["additionalProperties"] = False
    for key, value in list(schema.items()):
        if key == "properties":
            schema[key] = {name: strict(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            schema[key] = strict(value)
        elif key == "anyOf":
            schema[key] = [strict(sub) for sub in value]
    return schema


def podgroup_schema(api_version: str) -> dict:
    crd = yaml.safe_load(PODGROUP_CRDS[api_version].read_text())
    version = api_version.split("/")[1]
    served = next(v for v in crd["spec"]["versions"] if v["name"] == version)
    return strict(served["schema"]["openAPIV3Schema"])


def validate_objects(objects: list[dict]) -> None:
    """Every object valid: Kubernetes kinds under kubernetes-validate --strict, PodGroups under their CRD."""
    for obj in objects:
        if obj["kind"] == "PodGroup":
            jsonschema.validate(obj, podgroup_schema(obj["apiVersion"]))
            continue
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} is invalid: {str(e).splitlines()[0]}")


def by_kind(objects: list[dict]) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for obj in objects:
        found.setdefault(obj["kind"], []).append(obj)
    return found


def options(**overrides) -> RenderOptions:
    values = dict(name="mnist", roles=[("worker", 2)], image="example.com/train:1",
                  command=["torchrun", "/workspace/train.py"])
    values.update(overrides)
    return RenderOptions(**values)
