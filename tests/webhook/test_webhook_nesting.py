"""Deeply nested JSON in a review is a malformed review (400), not a server error (issue 23 item 8).

Where the recursion happens: at 1,000 levels and beyond, in json.loads itself (its C scanner stops at the
interpreter's recursion limit); from ~500 to ~999, in the mutation's deep copy of the workload
(webhook/admission/workloads.py's copy.deepcopy takes two frames per level). No Kubernetes object nests that deep: a
StatefulSet is about 20 levels.
"""

from __future__ import annotations

import json

import pytest

from objects import review, statefulset


def nested_review(depth: int, where: str) -> bytes:
    sent = review(statefulset("deep", 2))
    if where == "object":
        sent["request"]["object"]["deep"] = "DEEP"
    else:
        sent["request"]["object"]["spec"]["template"]["spec"]["containers"][0]["args"] = "DEEP"
    return json.dumps(sent).replace('"DEEP"', "[" * depth + "]" * depth).encode()


@pytest.mark.parametrize("where", ["object", "container"])
@pytest.mark.parametrize("depth", [600, 1_000, 100_000])
def test_a_deeply_nested_review_is_answered_400_and_the_server_goes_on(webhook, depth, where):
    reply = webhook.post(None, raw=nested_review(depth, where))
    assert reply.status_code == 400, reply.text[:300]
    assert reply.json() == {"error": "the body nests arrays or objects too deeply for an AdmissionReview"}
    assert webhook.post(review(statefulset("after", 2))).json()["response"]["allowed"] is True


def test_a_review_nested_as_deep_as_a_real_object_is_still_answered(webhook):
    reply = webhook.post(None, raw=nested_review(100, "container"))
    assert reply.status_code == 200 and reply.json()["response"]["allowed"] is True
