"""The notary's pure decisions: who a TokenReview names, who is a member, who coordinates, what a record writes.

Pods are built as the controllers make them (tests/support/objects.py) from templates as the webhook leaves them stamped;
the cluster half (real tokens, a real API server) is test_notary_cluster.py.
"""

from __future__ import annotations

import copy
import json

import pytest

from objects import pod_of_statefulset, statefulset
from trainhook.webhook.notary.membership import (Identity, Refusal, decide, gang_key, gang_workloads,
                                                 identity_from_review, pick_anchor, place_of, token_claims)
from trainhook.webhook.notary.records import (BadBody, outcome_message, parse_event, parse_outcome, record_patch,
                                              recorded_outcome, same_record)

NS = "team-a"


def stamped(name: str, replicas: int, job: str | None = None, role: str = "worker", uid: str = "") -> dict:
    """A StatefulSet as stored after admission: the job name and shape stamped on its template."""
    job = job or name
    sts = statefulset(name, replicas, labels={"trainhook.dev/job-name": job, "trainhook.dev/role": role},
                      annotations=None, service=job)
    sts["spec"]["template"]["metadata"]["annotations"] = {"trainhook.dev/replicas": f"{role}={replicas}"}
    sts["metadata"]["uid"] = uid or f"uid-{name}"
    return sts


def pod(sts: dict, ordinal: int) -> dict:
    p = pod_of_statefulset(sts, ordinal)
    p["metadata"]["ownerReferences"][0]["uid"] = sts["metadata"]["uid"]
    p["metadata"]["uid"] = f"pod-{p['metadata']['name']}"
    p["spec"]["serviceAccountName"] = "trainer"
    return p


def identity(p: dict) -> Identity:
    return Identity(NS, "trainer", p["metadata"]["name"], p["metadata"]["uid"])


def review(name: str, uid: str, username: str = f"system:serviceaccount:{NS}:trainer") -> dict:
    return {"authenticated": True, "user": {"username": username, "extra": {
        "authentication.kubernetes.io/pod-name": [name], "authentication.kubernetes.io/pod-uid": [uid]}}}


def test_a_review_names_the_pod_or_is_refused_401():
    assert identity_from_review(review("p-0", "u1")) == Identity(NS, "trainer", "p-0", "u1")
    for status, why in [({"authenticated": False, "error": "expired"}, "expired"),
                        (review("p-0", "u1", username="jane@example.com"), "not a ServiceAccount's"),
                        ({"authenticated": True, "user": {"username": f"system:serviceaccount:{NS}:trainer"}},
                         "not bound to a pod")]:
        with pytest.raises(Refusal) as refused:
            identity_from_review(status)
        assert refused.value.status == 401 and why in refused.value.reason


def test_a_member_of_a_statefulset_gang_and_its_coordinator():
    sts = stamped("ddp", 3)
    pods = [pod(sts, i) for i in range(3)]
    place = place_of(identity(pods[2]), pods[2])
    assert (place.job, place.member.rank, place.anchor_hostname) == ("ddp", 2, "ddp-0")
    anchor = pick_anchor(place, pods)
    assert anchor is pods[0]
    gang = decide(place, anchor, sts, None)
    assert gang.gang_id == f"{NS}/ddp/uid-ddp" and not gang.coordinator
    assert decide(place_of(identity(pods[0]), pods[0]), anchor, sts, None).coordinator


def test_the_token_of_a_deleted_and_recreated_pod_or_a_pod_outside_any_gang_is_refused():
    sts = stamped("ddp", 2)
    p = pod(sts, 1)
    for current, why in [(None, "does not exist"), ({**p, "metadata": {**p["metadata"], "uid": "new"}},
                                                    "not the pod the token was issued to")]:
        with pytest.raises(Refusal) as refused:
            place_of(identity(p), current)
        assert refused.value.status == 403 and why in refused.value.reason
    unlabeled = copy.deepcopy(p)
    del unlabeled["metadata"]["labels"]["trainhook.dev/job-name"]
    with pytest.raises(Refusal, match="in no gang"):
        place_of(identity(unlabeled), unlabeled)
    shapeless = copy.deepcopy(p)
    del shapeless["metadata"]["annotations"]["trainhook.dev/replicas"]
    with pytest.raises(Refusal, match="was not admitted as a member"):
        place_of(identity(shapeless), shapeless)


def test_a_bare_pod_with_the_gangs_labels_is_not_a_member():
    sts = stamped("ddp", 2)
    pods = [pod(sts, i) for i in range(2)]
    bare = copy.deepcopy(pods[1])
    bare["metadata"].update(name="ddp-7", uid="forger", ownerReferences=[])
    bare["metadata"]["labels"]["trainhook.dev/index"] = "1"
    place = place_of(identity(bare), bare)
    with pytest.raises(Refusal) as refused:
        pick_anchor(place, pods + [bare])
    assert refused.value.status == 403 and "rank 0 is ddp-0" in refused.value.reason


def test_a_pod_naming_the_gangs_statefulset_with_another_uid_is_not_a_member():
    """A forged owner reference (the real uid takes `create pods` in the namespace: trusted, docs/operate/security.md)."""
    sts = stamped("ddp", 2)
    pods = [pod(sts, i) for i in range(2)]
    forged = copy.deepcopy(pods[1])
    forged["metadata"]["uid"] = "forged-pod"
    forged["metadata"]["ownerReferences"][0]["uid"] = "made-up"
    place = place_of(identity(forged), forged)
    with pytest.raises(Refusal) as refused:
        decide(place, pick_anchor(place, pods), sts, sts)
    assert refused.value.status == 403 and "not a workload of gang" in refused.value.reason


def test_a_multi_role_gangs_other_workload_is_a_member_only_when_it_carries_the_job_name():
    master, worker = stamped("gang-master", 1, job="gang", role="master"), stamped("gang-worker", 2, job="gang")
    for sts in (master, worker):
        sts["spec"]["template"]["metadata"]["annotations"]["trainhook.dev/replicas"] = "master=1,worker=2"
    anchor, member = pod(master, 0), pod(worker, 1)
    place = place_of(identity(member), member)
    assert place.member.rank == 2 and place.anchor_hostname == "gang-master-0"
    gang = decide(place, pick_anchor(place, [anchor, member]), master, worker)
    assert gang.anchor_workload.name == "gang-master" and not gang.coordinator
    unlabeled = copy.deepcopy(worker)
    unlabeled["metadata"]["labels"].pop("trainhook.dev/job-name")
    unlabeled["spec"]["template"]["metadata"]["labels"].pop("trainhook.dev/job-name")
    with pytest.raises(Refusal, match="not a workload of gang"):
        decide(place, anchor, master, unlabeled)


def test_rank_0_missing_or_its_workload_replaced_is_503_and_two_claimants_403():
    sts = stamped("ddp", 2)
    pods = [pod(sts, i) for i in range(2)]
    place = place_of(identity(pods[1]), pods[1])
    with pytest.raises(Refusal) as refused:
        pick_anchor(place, [pods[1]])
    assert refused.value.status == 503 and "does not exist yet" in refused.value.reason
    with pytest.raises(Refusal) as refused:
        decide(place, pods[0], {**sts, "metadata": {**sts["metadata"], "uid": "recreated"}}, None)
    assert refused.value.status == 503
    twin = copy.deepcopy(pods[0])
    twin["metadata"]["uid"] = "twin"
    with pytest.raises(Refusal) as refused:
        pick_anchor(place, [pods[0], twin])
    assert refused.value.status == 403 and "several pods claim rank 0" in refused.value.reason


def test_the_key_changes_with_the_workloads_uid_and_with_the_gang_key():
    first, again = stamped("ddp", 2, uid="one"), stamped("ddp", 2, uid="two")
    keys = set()
    for sts, secret in [(first, b"k1"), (again, b"k1"), (first, b"k2")]:
        p = [pod(sts, 0), pod(sts, 1)]
        place = place_of(identity(p[1]), p[1])
        keys.add(gang_key(secret, decide(place, p[0], sts, None)))
    assert len(keys) == 3


def test_the_gangs_workloads_are_the_anchors_then_the_other_controllers():
    master, worker = stamped("g-master", 1, job="g", role="master"), stamped("g-worker", 2, job="g")
    for sts in (master, worker):
        sts["spec"]["template"]["metadata"]["annotations"]["trainhook.dev/replicas"] = "master=1,worker=2"
    anchor = pod(master, 0)
    gang = decide(place_of(identity(anchor), anchor), anchor, master, None)
    refs = gang_workloads(gang, [pod(worker, 0), anchor, pod(worker, 1)])
    assert [(r.kind, r.name) for r in refs] == [("StatefulSet", "g-master"), ("StatefulSet", "g-worker")]


def test_an_outcome_body_is_checked_and_recorded_as_annotations_and_a_label():
    body = {"outcome": {"phase": "Failed", "code": 3, "reason": "rank 1\nexited 3", "rank": 1,
                        "time": "2024-05-06T07:08:09Z", "attempt": 2, "restarts": 1, "pod": "ddp-1",
                        "started": "2024-05-06T07:00:00Z",
                        # The deciding rank's and rank 0's lines are kept; rank 2's are not the record's to keep.
                        "logs": {"1": "step 9\nValueError: bad batch\n", "0": "rank 0 waiting", "2": "not kept"}}}
    outcome = parse_outcome(body)
    assert outcome["reason"] == "rank 1 exited 3"  # one line
    assert set(outcome["logs"]) == {0, 1}
    # The notary adds the gang's pods by rank (webhook/notary/service.py) before it records: the last lines name their pod.
    patch = record_patch({**outcome, "pods": {0: "ddp-0", 1: "ddp-1", 2: "ddp-2"}}, "42")
    last_lines = json.loads(patch["metadata"]["annotations"].pop("trainhook.dev/last-lines"))
    assert patch == {"metadata": {"resourceVersion": "42", "labels": {"trainhook.dev/phase": "Failed"}, "annotations": {
        "trainhook.dev/phase": "Failed", "trainhook.dev/phase-time": "2024-05-06T07:08:09Z",
        "trainhook.dev/phase-reason": "rank 1 exited 3", "trainhook.dev/exit-code": "3",
        "trainhook.dev/phase-rank": "1", "trainhook.dev/phase-pod": "ddp-1", "trainhook.dev/attempts": "2",
        "trainhook.dev/start-time": "2024-05-06T07:00:00Z"}}}
    assert last_lines == [{"rank": 0, "pod": "ddp-0", "lines": "rank 0 waiting"},
                          {"rank": 1, "pod": "ddp-1", "lines": outcome["logs"][1]}]
    assert "ValueError: bad batch" in last_lines[1]["lines"]
    recorded = recorded_outcome({"metadata": patch["metadata"]})
    assert same_record(recorded, outcome) and not same_record(recorded, {**outcome, "code": 4})
    assert outcome_message(outcome) == ("Warning", "GangFailed", "gang failed: rank 1 (pod ddp-1) exited 3: "
                                                                 "rank 1 exited 3")
    for bad, field in [({"outcome": {**body["outcome"], "phase": "Done"}}, "outcome.phase"),
                       ({"outcome": {**body["outcome"], "code": "3"}}, "outcome.code"),
                       ({"outcome": {**body["outcome"], "time": "yesterday"}}, "outcome.time"),
                       ([], "the body must be")]:
        with pytest.raises(BadBody, match=field):
            parse_outcome(bad)


def test_an_event_body_is_checked():
    assert parse_event({"type": "Normal", "reason": "GangRestarted", "message": "a\nb"}) == (
        "Normal", "GangRestarted", "a b")
    for bad, what in [({"type": "Error", "reason": "X"}, "type"), ({"type": "Normal", "reason": "not camel"},
                                                                     "reason")]:
        with pytest.raises(BadBody, match=what):
            parse_event(bad)


# --- the confused deputy (issue 31 item 1): the notary acts only on workloads that are the gang's --------------------

def test_a_pod_naming_an_unrelated_statefulset_as_its_controller_is_refused_as_an_anchor():
    """A user who may only create pods wrote an ownerReference to an unrelated, unlabeled StatefulSet `db` on a pod
    labeled rank 0 of a gang `db` (the webhook now refuses such a create: test_provenance.py; a later patch of the
    ownerReferences ends here): the notary never takes `db` for a gang's workload."""
    gang_sts = stamped("db", 2)
    unrelated = copy.deepcopy(gang_sts)
    for where in (unrelated["metadata"]["labels"], unrelated["spec"]["template"]["metadata"]["labels"]):
        where.pop("trainhook.dev/framework", None)
        where.pop("trainhook.dev/job-name", None)
    p = pod(gang_sts, 0)
    place = place_of(identity(p), p)
    with pytest.raises(Refusal) as refused:
        decide(place, p, unrelated, None)
    assert refused.value.status == 403
    assert "names StatefulSet/db as its controller, which is not a trainhook gang of job db" in refused.value.reason


def test_a_look_alike_with_another_teams_job_name_forms_a_gang_of_its_own_and_never_touches_the_other():
    """An `edit` user's StatefulSet `evil` whose template carries the job name `vic1`: its pods are a gang of their
    own (anchored at evil-0, keyed by evil's uid), and the records of either gang touch only its own workload."""
    victim, evil = stamped("vic1", 2), stamped("evil", 2, job="vic1")
    pods = [pod(victim, 0), pod(victim, 1), pod(evil, 0), pod(evil, 1)]
    evil_place = place_of(identity(pods[2]), pods[2])
    evil_gang = decide(evil_place, pick_anchor(evil_place, pods), evil, None)
    assert evil_gang.coordinator and evil_gang.anchor_workload.name == "evil"
    assert [ref.name for ref in gang_workloads(evil_gang, pods)] == ["evil"]
    victim_place = place_of(identity(pods[1]), pods[1])
    victim_gang = decide(victim_place, pick_anchor(victim_place, pods), victim, None)
    assert [ref.name for ref in gang_workloads(victim_gang, pods)] == ["vic1"]
    assert gang_key(b"k" * 32, evil_gang) != gang_key(b"k" * 32, victim_gang)


def test_a_multi_role_gang_spans_its_role_workloads_only():
    master, worker = stamped("tf-master", 1, job="tf", role="master"), stamped("tf-worker", 2, job="tf")
    for sts in (master, worker):
        sts["spec"]["template"]["metadata"]["annotations"]["trainhook.dev/replicas"] = "master=1,worker=2"
    other = stamped("tf-extra", 2, job="tf")
    other["spec"]["template"]["metadata"]["annotations"]["trainhook.dev/replicas"] = "master=1,worker=2"
    pods = [pod(master, 0), pod(worker, 0), pod(worker, 1), pod(other, 0)]
    place = place_of(identity(pods[1]), pods[1])
    gang = decide(place, pick_anchor(place, pods), master, worker)
    assert gang.roles == ("master", "worker")
    assert [ref.name for ref in gang_workloads(gang, pods)] == ["tf-master", "tf-worker"]
    extra = place_of(identity(pods[3]), pods[3])
    with pytest.raises(Refusal) as refused:
        decide(extra, pick_anchor(extra, pods), master, other)
    assert refused.value.status == 403 and "StatefulSet/tf-extra, which is not a workload of gang" in \
        refused.value.reason


def test_a_pod_whose_owner_or_gang_was_patched_after_admission_fails_its_provenance_stamp():
    """The webhook stamps what it admitted (webhook/admission/provenance.py); the notary, given the key, refuses a
    pod that says something else now (issue 31 item 1). Deterministic half of test_notary_cluster.py's attack."""
    from trainhook.webhook.admission import provenance

    key = b"k" * 32
    sts, other = stamped("mine", 2), stamped("theirs", 2)
    p = pod(sts, 1)
    p["metadata"].setdefault("annotations", {})["trainhook.dev/provenance"] = provenance.stamp(key, NS, p)
    assert place_of(identity(p), p, key).owner.name == "mine"
    relabeled = copy.deepcopy(p)  # moved into another gang by a label patch
    relabeled["metadata"]["labels"]["trainhook.dev/job-name"] = "theirs"
    reowned = copy.deepcopy(p)  # its owner's uid swapped for another StatefulSet's of the same name
    reowned["metadata"]["ownerReferences"][0]["uid"] = other["metadata"]["uid"]
    unstamped = copy.deepcopy(p)  # made by someone else than its controller: the webhook stamped nothing
    del unstamped["metadata"]["annotations"]["trainhook.dev/provenance"]
    copied = pod(sts, 0)  # rank 1's stamp copied onto rank 0's pod
    copied["metadata"].setdefault("annotations", {})["trainhook.dev/provenance"] = \
        p["metadata"]["annotations"]["trainhook.dev/provenance"]
    for current in (relabeled, reowned, unstamped, copied):
        with pytest.raises(Refusal) as refused:
            place_of(identity(current), current, key)
        assert refused.value.status == 403 and "provenance stamp does not match" in refused.value.reason
    anchor = pod(sts, 0)  # rank 0 without a stamp: no gang is anchored at it
    with pytest.raises(Refusal) as refused:
        decide(place_of(identity(p), p, key), anchor, sts, None, key)
    assert "rank 0's pod mine-0 names StatefulSet/mine" in refused.value.reason


def test_a_shared_anchor_is_judged_once_for_its_members_and_a_refusal_is_judged_again():
    """At a gang's start every member's call shares one read of rank 0's pod and workload (service.py's Anchor):
    what they say of the gang is judged once and kept with that read, the members' own places each time. A refusal
    is not kept (each requester is judged, and named, again), and another gang key is another judgment."""
    from trainhook.webhook.admission import provenance
    from trainhook.webhook.notary.membership import WorkloadRef, admit
    from trainhook.webhook.notary.service import Anchor

    key = b"k" * 32
    sts = stamped("ddp", 3)
    pods = [pod(sts, i) for i in range(3)]
    for p in pods:
        p["metadata"].setdefault("annotations", {})["trainhook.dev/provenance"] = provenance.stamp(key, NS, p)
    anchor = Anchor(pods[0], WorkloadRef("StatefulSet", "ddp", "uid-ddp"), sts)
    verdict = anchor.verdict(NS, "ddp", key)
    assert anchor.verdict(NS, "ddp", key) is verdict and len(anchor.verdicts) == 1
    for p in pods:  # the same gang as the whole decision gives, for rank 0 and the others
        place = place_of(identity(p), p, key)
        assert admit(place, verdict, None) == decide(place, pods[0], sts, None, key)
    assert [admit(place_of(identity(p), p, key), verdict, None).coordinator for p in pods] == [True, False, False]
    with pytest.raises(Refusal) as refused:  # rank 0's stamp is not under another key: judged anew, refused
        anchor.verdict(NS, "ddp", b"another key" * 3)
    assert refused.value.status == 403 and len(anchor.verdicts) == 1
    gone = Anchor(pods[0], WorkloadRef("StatefulSet", "ddp", "uid-ddp"), None)  # its workload deleted
    for _ in range(2):
        with pytest.raises(Refusal) as refused:
            gone.verdict(NS, "ddp", key)
        assert refused.value.status == 503
    assert not gone.verdicts


def test_a_token_nested_past_the_parsers_recursion_limit_names_no_pod():
    import base64

    deep = base64.urlsafe_b64encode(b"[" * 5000).decode().rstrip("=")
    assert token_claims(f"e30.{deep}.c2ln") is None
