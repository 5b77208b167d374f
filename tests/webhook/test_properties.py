"""Property tests over generated and corrupted reviews: never a crash or a 5xx; a 400, or a valid answer whose
patch applies and (for a valid object) yields a valid object."""

from __future__ import annotations

import base64
import copy
import json

import jsonpatch
import kubernetes_validate
from hypothesis import HealthCheck, given, settings, strategies as st

from trainhook.webhook.admission.jsondiff import json_copy, same
from trainhook.webhook.admission.review import BadReview, review
from trainhook.webhook.settings import Settings
from objects import container, indexed_job, pod_of_job, pod_of_statefulset, review as make_review, service, statefulset

SETTINGS = Settings()
KEYS = ["trainhook.dev/framework", "trainhook.dev/job-name", "trainhook.dev/role", "trainhook.dev/index"]
ANNOTATIONS = ["trainhook.dev/replicas", "trainhook.dev/port", "trainhook.dev/nproc-per-node",
               "trainhook.dev/elastic", "trainhook.dev/container", "trainhook.dev/gang-wait"]
VALUES = st.sampled_from(["pytorch", "tensorflow", "jax", "worker", "master", "chief", "0", "3", "x", "",
                          "worker=2", "master=1,worker=2", "2:4", "auto", "8", "tcp", "none", "trainer",
                          "65535", "ddp", "a" * 70])
LABELS = st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=4)
ANNOTATION_MAPS = st.dictionaries(st.sampled_from(ANNOTATIONS), VALUES, max_size=4)
ENV = st.lists(st.builds(lambda n, v: {"name": n, "value": v}, st.sampled_from(["RANK", "WORLD_SIZE", "LR", "X"]),
                         st.text(max_size=5)), max_size=3, unique_by=lambda e: e["name"])


def relabel(obj: dict, labels: dict, annotations: dict) -> dict:
    obj = copy.deepcopy(obj)
    for meta in (obj["metadata"], obj.get("spec", {}).get("template", {}).get("metadata")):
        if meta is not None:
            meta.setdefault("labels", {}).update(labels)
            if annotations:
                meta.setdefault("annotations", {}).update(annotations)
    return obj


@st.composite
def k8s_objects(draw) -> dict:
    labels, annotations = draw(LABELS), draw(ANNOTATION_MAPS)
    replicas = draw(st.integers(1, 5))
    gpus = draw(st.sampled_from([0, 0, 1, 8]))
    containers = [container(gpus=gpus, env=draw(ENV))]
    shape = draw(st.sampled_from(["sts", "sts-pod", "job", "job-pod", "service"]))
    if shape == "service":
        return relabel(service("svc"), {"trainhook.dev/job-name": "svc"}, {})
    if shape.startswith("sts"):
        obj = relabel(statefulset("w", replicas, containers=containers), labels, annotations)
        if shape == "sts-pod":
            obj = pod_of_statefulset(obj, draw(st.integers(0, replicas - 1)))
        return obj
    obj = relabel(indexed_job("j", replicas, containers=containers), labels, annotations)
    return pod_of_job(obj, draw(st.integers(0, replicas - 1))) if shape == "job-pod" else obj


def apply_answer(sent: dict, answer: dict) -> dict | None:
    response = answer["response"]
    assert response["uid"] == sent["request"]["uid"]
    assert isinstance(response["allowed"], bool)
    if not response["allowed"]:
        assert response["status"]["message"].startswith("trainhook: ")
        assert "patch" not in response
        return None
    obj = sent["request"]["object"]
    if "patch" not in response:
        return obj
    return jsonpatch.JsonPatch(json.loads(base64.b64decode(response["patch"]))).apply(obj)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(k8s_objects())
def test_generated_valid_objects_stay_valid(obj):
    kubernetes_validate.validate(obj, "1.33.0", strict=True)
    sent = make_review(obj)
    before = json_copy(sent)
    result = apply_answer(sent, review(sent, SETTINGS).answer)
    assert same(sent, before), "the review must not change the object it was sent"
    if result is not None:
        kubernetes_validate.validate(result, "1.33.0", strict=True)
        second = make_review(result)
        again = apply_answer(second, review(second, SETTINGS).answer)
        assert again == result, "mutating a mutated object must change nothing"


JSON_LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**12), st.floats(allow_nan=False),
                        st.text(max_size=8))
JSON_VALUES = st.recursive(JSON_LEAVES, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                                st.dictionaries(st.text(max_size=6), inner,
                                                                                max_size=3)), max_leaves=8)


def paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from paths(value, prefix + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from paths(value, prefix + (i,))


@settings(max_examples=400, deadline=None)
@given(k8s_objects(), st.data())
def test_corrupted_reviews_are_a_400_or_a_clean_answer(obj, data):
    sent = make_review(obj)
    for _ in range(data.draw(st.integers(1, 3))):
        where = data.draw(st.sampled_from([p for p in paths(sent) if p]))
        node = sent
        for step in where[:-1]:
            node = node[step]
        if isinstance(node, (dict, list)):
            try:
                node[where[-1]] = data.draw(JSON_VALUES)
            except (IndexError, KeyError, TypeError):
                pass
    parsed, before = json.loads(json.dumps(sent)), json.loads(json.dumps(sent))
    try:
        answer = review(parsed, SETTINGS).answer
    except BadReview as e:
        assert str(e)
        return
    finally:
        assert same(parsed, before), "the review must not change the object it was sent"
    json.dumps(answer)
    if answer["response"].get("patch"):
        apply_answer(sent, answer)
