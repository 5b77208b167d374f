"""trainhook local: reading manifests as kubectl does."""

from __future__ import annotations

import pytest

from trainhook.local.manifest import ManifestError, load_manifest, parse_manifest

MANIFEST = """
apiVersion: v1
kind: Service
metadata: {name: gang}
spec: {clusterIP: None}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: script, namespace: team}
data: {train.py: "print(1)"}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: gang}
spec: {serviceName: gang, template: {spec: {containers: [{name: c, command: [x]}]}}}
---
apiVersion: batch/v1
kind: Job
metadata: {name: j}
spec: {completionMode: Indexed, completions: 2, template: {spec: {containers: [{name: c, command: [x]}]}}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
---
apiVersion: v1
kind: Pod
metadata: {name: solo}
spec: {containers: [{name: c, command: [x]}]}
---
"""


def test_objects_are_sorted_by_role_and_keep_file_order():
    manifest = parse_manifest(MANIFEST)
    assert [s["metadata"]["name"] for s in manifest.services] == ["gang"]
    assert [(w["kind"], w["metadata"]["name"]) for w in manifest.workloads] == [
        ("StatefulSet", "gang"), ("Job", "j"), ("Pod", "solo")]
    assert list(manifest.configmaps) == [("team", "script")]


def test_unsupported_kinds_are_listed_not_kept():
    manifest = parse_manifest(MANIFEST)
    assert manifest.ignored == ["Deployment/web (apps/v1)"]


def test_a_statefulset_of_an_old_api_version_is_ignored():
    text = "apiVersion: apps/v1beta1\nkind: StatefulSet\nmetadata: {name: old}\n"
    assert parse_manifest(text).ignored == ["StatefulSet/old (apps/v1beta1)"]


def test_namespace_defaults_to_default_or_the_flag():
    assert parse_manifest(MANIFEST).workloads[0]["metadata"]["namespace"] == "default"
    manifest = parse_manifest(MANIFEST.replace("namespace: team", "namespace: ml"), namespace="ml")
    assert {w["metadata"]["namespace"] for w in manifest.workloads} == {"ml"}


def test_a_namespace_flag_that_contradicts_the_object_is_refused():
    with pytest.raises(ManifestError, match="does not match the namespace 'ml'"):
        parse_manifest(MANIFEST, namespace="ml")


def test_invalid_yaml_names_line_and_column(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("apiVersion: v1\nkind: Pod\nmetadata:\n  name: [unclosed\n")
    with pytest.raises(ManifestError) as error:
        load_manifest(path)
    message = str(error.value)
    assert message.startswith(f"{path}:5:1: invalid YAML")
    assert "flow sequence" in message


def test_a_document_that_is_not_an_object_is_refused():
    with pytest.raises(ManifestError, match="document 2 is a list"):
        parse_manifest("apiVersion: v1\nkind: Pod\nmetadata: {name: a}\n---\n- 1\n")


def test_kind_list_is_expanded():
    text = "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Pod, metadata: {name: a}}\n"
    assert [w["metadata"]["name"] for w in parse_manifest(text).workloads] == ["a"]


def test_the_same_object_twice_is_refused():
    text = "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: a}\n"
    with pytest.raises(ManifestError, match="pod/a appears twice"):
        parse_manifest(text)


def test_a_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ManifestError, match="cannot read .*nope.yaml"):
        load_manifest(tmp_path / "nope.yaml")


LABELED_DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: trainer, labels: {trainhook.dev/framework: pytorch}}
spec:
  replicas: 2
  selector: {matchLabels: {app: trainer}}
  template:
    metadata: {labels: {app: trainer}}
    spec: {containers: [{name: c, image: x, command: [python, train.py]}]}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: c, image: x}]}
"""


def test_a_deployment_labeled_for_training_is_refused_by_name_and_an_unlabeled_one_ignored(tmp_path):
    """As the webhook refuses it at admission, `trainhook local` refuses it rather than warning and running the rest
    (a local run must never be kinder than a cluster); the unlabeled Deployment stays a warning."""
    with pytest.raises(ManifestError) as caught:
        parse_manifest(LABELED_DEPLOYMENT, "deploy.yaml")
    assert str(caught.value) == (
        "deploy.yaml: deployment/trainer: it is labeled trainhook.dev/framework, but Deployment is an unsupported "
        "kind: trainhook does not wire it (its pods have no stable index for a rank, nor an address a peer can "
        "resolve); the supported kinds are StatefulSet, Job (Indexed), Pod, Service: make it a StatefulSet (with a "
        "headless Service as its serviceName) or an Indexed Job, e.g. with trainhook render")
    manifest = parse_manifest(LABELED_DEPLOYMENT.split("---")[1], "web.yaml")
    assert manifest.ignored == ["Deployment/web (apps/v1)"]
