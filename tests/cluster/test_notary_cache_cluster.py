"""The notary's caches against a real kube-apiserver (v1.20, started by the tests): the rules of
webhook/notary/cache.py and Notary.verify, each tried where a stale copy would give the wrong answer.

The notary runs in this process (webhook/notary/service.py's Notary over the real ClusterAuthority, the admin's
credentials), so each test can set the caches' lifetimes far beyond the defaults (a recreated job within them),
look at what is kept, and count the API calls the authority makes (a subclass that counts, then calls the real
API server). The HTTP layer around it is the one test_notary_cluster.py drives through the webhook process.
"""

from __future__ import annotations

import asyncio
import collections
import time

import pytest
from kubernetes import client

from helpers import wait_for
from test_notary_cluster import GANG_KEY, create_gang, expected_key, imposter_pod, outcome, pod_token

from trainhook.webhook.notary.service import Notary
from trainhook.webhook.notary.cache import MAX_REFUSALS, ReviewCache, SharedReads
from trainhook.webhook.notary.cluster import ClusterAuthority
from trainhook.webhook.notary.membership import Refusal
from trainhook.webhook.notary.records import parse_outcome

LONG = 600.0  # seconds: every step of a test happens within the caches' lifetime


class CountingAuthority(ClusterAuthority):
    """The real cluster authority, counting every API request it sends by kind (the published keys' reads, the
    pod watch's lists and watches included)."""

    def __init__(self, api, local_tokens: bool = True):
        super().__init__(api, local_tokens=local_tokens)
        self.calls: collections.Counter[str] = collections.Counter()

    def _send(self, method, path, body, content_type, query, timeout, accept="application/json"):
        kind = ("review" if "tokenreviews" in path else "keys" if path.startswith(("/.well-known/", "/openid/"))
                else "watch" if ("watch", "true") in query else "pods" if query else
                "pod" if "/pods/" in path else "workload" if "/statefulsets/" in path or "/jobs/" in path else path)
        self.calls[kind] += 1
        return super()._send(method, path, body, content_type, query, timeout, accept)


def watching(authority: ClusterAuthority, namespace: str) -> None:
    """Start the namespace's pod watch (as a first credential call does) and wait until it is live."""
    authority.pods.lookup(namespace, "-", "-")
    wait_for(f"the pod watch of {namespace}", lambda: authority.pods.watched[namespace].live, timeout=10)


@pytest.fixture
def notary(control_plane, gang_webhook):
    """This process's notary; the gang pods are admitted and stamped by `gang_webhook` under the same key."""
    api = control_plane.api_client()
    authority = CountingAuthority(api)
    notary = Notary(authority, GANG_KEY, reviews=ReviewCache(max_age=LONG), anchors=SharedReads(ttl=LONG))
    yield notary
    authority.pods.stop()
    authority.threads.shutdown()
    api.close()


def credential(notary: Notary, token: str) -> dict:
    """POST /v1/credential's answer, as its handler computes it (a Refusal as raised)."""
    return notary.credential(asyncio.run(notary.verify(token, shared=True)))


def refusal(notary: Notary, token: str, shared: bool = True) -> Refusal:
    with pytest.raises(Refusal) as caught:
        asyncio.run(notary.verify(token, shared))
    return caught.value


def test_a_gangs_members_share_one_anchor_read_and_their_reviews_are_kept(notary, control_plane,
                                                                           k8s_namespace):
    api = control_plane.api_client()
    sts = create_gang(api, k8s_namespace, "burst", replicas=8)
    tokens = [pod_token(api, k8s_namespace, f"burst-{i}") for i in range(8)]

    async def together():
        return await asyncio.gather(*(notary.verify(token, shared=True) for token in tokens))

    gang, key = expected_key(k8s_namespace, "burst", sts["metadata"]["uid"])
    calls = notary.authority.calls
    watching(notary.authority, k8s_namespace)
    assert calls == {"pods": 1, "watch": 1}, calls  # the namespace's gang pods: a list, then a watch
    calls.clear()
    assert {notary.credential(v)["key"] for v in asyncio.run(together())} == {key}
    # Before: 8 reviews, 16 pod GETs (each member's own and rank 0's), 8 StatefulSet GETs; then (issue 22) 8
    # reviews, 9 pod GETs, 1 StatefulSet GET. Now the API server's discovery document and keys (once for the
    # notary's life), rank 0's pod and its StatefulSet once for the gang, and nothing per member.
    assert calls == {"keys": 2, "pod": 1, "workload": 1}, calls
    calls.clear()
    assert {notary.credential(v)["key"] for v in asyncio.run(together())} == {key}
    assert calls == {}, calls  # each member's own pod, from the watch: nothing at all (was 8 pod GETs)
    calls.clear()
    assert asyncio.run(notary.verify(tokens[0])).gang.coordinator  # outcome and event calls: a fresh anchor
    assert calls == {"pod": 2, "workload": 1}, calls


class SlowListAuthority(CountingAuthority):
    """Lists the namespace's gang pods a second late, as a 10,000-pod list is on a loaded API server."""

    def _list_gang_pods_blocking(self, namespace: str) -> dict:
        time.sleep(1.0)
        return super()._list_gang_pods_blocking(namespace)


def test_members_who_ask_while_the_first_list_runs_wait_for_it_instead_of_a_get_each(control_plane, gang_webhook,
                                                                                    k8s_namespace):
    """Issue 32: at 10,000 members the first list of the namespace's pods took seconds, and every credential call
    meanwhile read its pod with a GET (230-330 of them). Now they wait for the list (pod_watch.FIRST_LIST_WAIT)."""
    api = control_plane.api_client()
    authority = SlowListAuthority(api)
    notary = Notary(authority, GANG_KEY, reviews=ReviewCache(max_age=LONG), anchors=SharedReads(ttl=LONG))
    try:
        sts = create_gang(api, k8s_namespace, "early", replicas=8)
        tokens = [pod_token(api, k8s_namespace, f"early-{i}") for i in range(8)]

        async def together():
            return await asyncio.gather(*(notary.verify(token, shared=True) for token in tokens))

        started = time.monotonic()
        keys_given = {notary.credential(v)["key"] for v in asyncio.run(together())}
        assert keys_given == {expected_key(k8s_namespace, "early", sts["metadata"]["uid"])[1]}
        assert time.monotonic() - started >= 1.0  # they did wait for the slow list
        # The namespace's list and watch, the published keys, rank 0's pod and its StatefulSet once for the gang:
        # no member's own pod (was 8 pod GETs, one a member, while the list ran).
        assert authority.calls == {"pods": 1, "watch": 1, "keys": 2, "pod": 1, "workload": 1}, authority.calls
    finally:
        authority.pods.stop()
        authority.threads.shutdown()
        api.close()


def test_a_job_recreated_within_the_caches_lifetime_gets_the_new_key_and_old_tokens_are_refused(
        notary, control_plane, k8s_namespace):
    api = control_plane.api_client()
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    first = create_gang(api, k8s_namespace, "again")
    old_tokens = {pod: pod_token(api, k8s_namespace, pod) for pod in ("again-0", "again-1")}
    old_key = expected_key(k8s_namespace, "again", first["metadata"]["uid"])[1]
    assert {credential(notary, token)["key"] for token in old_tokens.values()} == {old_key}

    apps.delete_namespaced_stateful_set("again", k8s_namespace, propagation_policy="Foreground")
    wait_for("the old gang's pods to be gone", lambda: not core.list_namespaced_pod(
        k8s_namespace, label_selector="app=again").items, timeout=60)
    wait_for("the old StatefulSet to be gone", lambda: not apps.list_namespaced_stateful_set(k8s_namespace).items)
    second = create_gang(api, k8s_namespace, "again")
    [kept] = [read for _, read in notary.anchors.kept.items.values()]
    assert kept.value.ref.uid == first["metadata"]["uid"]  # the copy the new members would be judged on is stale

    for pod in ("again-1", "again-0"):
        answer = credential(notary, pod_token(api, k8s_namespace, pod))
        assert answer == {"namespace": k8s_namespace, "job": "again", "key": expected_key(
            k8s_namespace, "again", second["metadata"]["uid"])[1],
            "gang": expected_key(k8s_namespace, "again", second["metadata"]["uid"])[0]}

    # The old pods' tokens: their reviews are kept (no TokenReview is made), and the uid check on the pod read
    # afresh refuses them, as it refuses a v1.20 TokenReview's own answer for them.
    notary.authority.calls.clear()
    for token in old_tokens.values():
        stale = refusal(notary, token)
        assert stale.status == 403 and "not the pod the token was issued to" in stale.reason
    assert notary.authority.calls["review"] == 0 and notary.authority.calls["pod"] == 2

    # A pod deleted with no successor: its kept review names a pod that no longer exists.
    gone_token = pod_token(api, k8s_namespace, "again-1")
    assert credential(notary, gone_token)["key"] != old_key
    apps.patch_namespaced_stateful_set_scale("again", k8s_namespace, {"spec": {"replicas": 1}})
    wait_for("again-1 to be gone", lambda: [p.metadata.name for p in core.list_namespaced_pod(
        k8s_namespace, label_selector="app=again").items] == ["again-0"], timeout=60)
    notary.authority.calls.clear()
    gone = refusal(notary, gone_token)
    assert gone.status == 403 and "does not exist" in gone.reason
    assert notary.authority.calls["review"] == 0


def test_a_replaced_rank_0_and_a_labeled_non_member_are_judged_on_fresh_reads(notary, control_plane,
                                                                               k8s_namespace):
    api = control_plane.api_client()
    core = client.CoreV1Api(api)
    sts = create_gang(api, k8s_namespace, "swap")
    key = expected_key(k8s_namespace, "swap", sts["metadata"]["uid"])[1]
    old_rank0 = pod_token(api, k8s_namespace, "swap-0")
    assert credential(notary, old_rank0)["key"] == key
    assert credential(notary, pod_token(api, k8s_namespace, "swap-1"))["key"] == key
    old_uid = core.read_namespaced_pod("swap-0", k8s_namespace).metadata.uid
    core.delete_namespaced_pod("swap-0", k8s_namespace)
    wait_for("the StatefulSet's new swap-0", lambda: any(
        p.metadata.name == "swap-0" and p.metadata.uid != old_uid
        for p in core.list_namespaced_pod(k8s_namespace, label_selector="app=swap").items), timeout=60)
    new_rank0 = pod_token(api, k8s_namespace, "swap-0")
    assert credential(notary, new_rank0)["key"] == key  # the same gang: its own pod vouches for the kept anchor
    verified = asyncio.run(notary.verify(new_rank0))  # an outcome or event call: rank 0's pod read afresh
    assert verified.gang.coordinator and verified.gang.anchor_pod == "swap-0"
    assert refusal(notary, old_rank0).status == 403

    # A bare pod that copies the gang's labels is refused while the gang's anchor is kept: it has no controller,
    # so nothing vouches for the copy, and it is judged on a fresh read.
    # Two of them at once share the anchor's read (the same gang, the same rank 0 hostname); each refusal names
    # its own pod, not the one whose request started the read.
    for name in ("imposter-a", "imposter-b"):
        core.create_namespaced_pod(k8s_namespace, imposter_pod("swap", 1, name))
    tokens = [pod_token(api, k8s_namespace, name) for name in ("imposter-a", "imposter-b")]

    async def together():
        return await asyncio.gather(*(notary.verify(token, shared=True) for token in tokens), return_exceptions=True)

    for name, refused in zip(("imposter-a", "imposter-b"), asyncio.run(together())):
        assert isinstance(refused, Refusal) and refused.status == 403, refused
        assert f"pod {k8s_namespace}/{name} is not of gang" in refused.reason and "rank 0 is swap-0" in refused.reason
        assert refused.who == f"{k8s_namespace}/{name}"


def test_a_flood_of_bogus_tokens_costs_no_review_and_keeps_the_caches_bounded(control_plane, gang_webhook,
                                                                               k8s_namespace):
    api = control_plane.api_client()
    authority = CountingAuthority(api)
    notary = Notary(authority, GANG_KEY, reviews=ReviewCache(size=16), anchors=SharedReads(size=8))
    create_gang(api, k8s_namespace, "flooded")
    watching(authority, k8s_namespace)
    member = pod_token(api, k8s_namespace, "flooded-1")
    key = credential(notary, member)["key"]
    header, payload, _ = member.split(".")

    async def flood(tokens: list[str]) -> collections.Counter:
        async def one(token):
            try:
                await notary.verify(token, shared=True)
                return "accepted"
            except Refusal as e:
                return e.status
        answers = collections.Counter()
        for start in range(0, len(tokens), 50):
            answers.update(await asyncio.gather(*(one(t) for t in tokens[start:start + 50])))
        return answers

    authority.calls.clear()
    garbage = [f"garbage-{n}" for n in range(3000)] + [f"{header}.e30.sig{n}" for n in range(1000)]
    assert asyncio.run(flood(garbage)) == {401: 4000}
    assert authority.calls == {}, authority.calls  # not a JWT naming a pod: refused without asking
    # The member's own claims with a forged signature: each is refused against the published keys, with no API
    # call (before: a TokenReview each), and nothing of them is kept; the member's kept answer stays.
    forged = [f"{header}.{payload}.forged{n}" for n in range(200)]
    assert asyncio.run(flood(forged)) == {401: 200}
    assert authority.calls == {}, authority.calls
    assert len(notary.reviews) == 1 and len(notary.refused) <= MAX_REFUSALS  # 4,200 refusals, kept bounded
    assert len(notary.anchors) == 1 and not notary.anchors.flying
    assert credential(notary, member)["key"] == key
    assert authority.calls == {}, authority.calls  # its pod from the watch, its anchor kept
    authority.pods.stop()
    authority.threads.shutdown()


def test_a_credential_is_refused_only_on_a_fresh_read_never_on_the_watchs_copy(notary, control_plane,
                                                                                k8s_namespace):
    """The watch's copy of a member's pod may serve a key, never a refusal: a copy that would refuse (here one made
    to lag behind the API server: its job-name label gone, as a watch a moment late would show a pod since
    relabeled) is checked by a GET, and the pod as it is now decides."""
    api = control_plane.api_client()
    sts = create_gang(api, k8s_namespace, "stale")
    key = expected_key(k8s_namespace, "stale", sts["metadata"]["uid"])[1]
    watching(notary.authority, k8s_namespace)
    pods = notary.authority.pods.watched[k8s_namespace]
    wait_for("stale-1 in the watch", lambda: "stale-1" in pods.pods)
    copy = pods.pods["stale-1"]
    labels = {k: v for k, v in copy["metadata"]["labels"].items() if k != "trainhook.dev/job-name"}
    pods.pods["stale-1"] = {**copy, "metadata": {**copy["metadata"], "labels": labels}}
    token = pod_token(api, k8s_namespace, "stale-1")
    notary.authority.calls.clear()
    assert credential(notary, token)["key"] == key
    assert notary.authority.calls["pod"] >= 1  # the member's pod read afresh: the copy alone would have refused it


def test_a_record_lists_the_gangs_pods_once(notary, control_plane, k8s_namespace):
    """Issue 32: a record listed the gang's pods twice, for the ranks' pod names and then for its workloads; at
    10,000 pods a list is seconds of the API server's and the notary's time (the outcome took 5.5-6.2 s)."""
    api = control_plane.api_client()
    create_gang(api, k8s_namespace, "once", replicas=3)
    verified = asyncio.run(notary.verify(pod_token(api, k8s_namespace, "once-0")))
    calls = notary.authority.calls
    calls.clear()
    recorded = asyncio.run(notary.record(verified, parse_outcome(outcome())))
    assert (recorded["phase"], recorded["pod"]) == ("Failed", "once-1")  # rank 1's pod, named from the list
    assert calls["pods"] == 1, calls
    sts = client.AppsV1Api(api).read_namespaced_stateful_set("once", k8s_namespace)
    assert sts.spec.replicas == 0 and sts.metadata.annotations.get("trainhook.dev/phase") == "Failed"
