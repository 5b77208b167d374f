"""A credential call waits for its namespace's first pod list at most its timeout, and a waiter that timed out
leaves nothing behind: while a list hangs, every credential call would otherwise leave a callback (issue 32)."""

from __future__ import annotations

import asyncio
import threading

from trainhook.webhook.notary.pod_watch import PodWatches


class HangingList:
    """A list call that does not answer until released; then an empty list, and a watch that ends at once."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def list_call(self, namespace: str) -> dict:
        self.release.wait(30)
        return {"metadata": {"resourceVersion": "1"}, "items": []}

    def watch_call(self, namespace: str, version: str):
        self.release.wait(30)
        return Ended()


class Ended:
    def stream_lines(self):
        return iter(())

    def close(self) -> None:
        pass


def test_waiters_that_time_out_leave_no_callback_and_the_list_still_wakes_the_rest():
    api = HangingList()
    watches = PodWatches(api.list_call, api.watch_call)
    assert watches.lookup("team-a", "p-0", "uid") is None  # starts the namespace's watch; its list hangs
    pods = watches.watched["team-a"]

    async def scenario() -> list[bool]:
        timed_out = await asyncio.gather(*(watches.first_list("team-a", timeout=0.05) for _ in range(200)))
        assert all(timed_out)  # each waited (the list was under way) and gave up
        assert not pods._wake, f"{len(pods._wake)} callbacks left by waiters that timed out"
        waiting = asyncio.ensure_future(watches.first_list("team-a", timeout=20))
        await asyncio.sleep(0.05)
        assert len(pods._wake) == 1
        api.release.set()
        return [await asyncio.wait_for(waiting, 10), await watches.first_list("team-a")]

    try:
        woken, later = asyncio.run(scenario())
    finally:
        api.release.set()
        watches.stop()
    assert woken is True and later is False  # woken by the list's end; afterwards there is nothing to wait for
    assert pods.first_done.is_set() and not pods._wake


class Listed(dict):
    """A list answer that a weak reference can follow (a plain dict cannot have one)."""


def test_the_list_is_freed_once_its_pods_are_kept_while_the_watch_goes_on():
    """The namespace's list (at a gang's start, every pod with its containers and status) was held for as long as
    the watch after it lasted; only its slimmed pods are kept."""
    import weakref

    watching, release, seen = threading.Event(), threading.Event(), []
    pod = {"metadata": {"name": "p-0", "uid": "u0", "labels": {"trainhook.dev/job-name": "g"}},
           "spec": {"containers": [{"name": "c", "env": [{"name": "A", "value": "1"}]}]}, "status": {"phase": "Running"}}

    def list_call(namespace: str) -> dict:
        listed = Listed(metadata={"resourceVersion": "7"}, items=[pod])
        seen.append(weakref.ref(listed))
        return listed

    class Blocking:
        def stream_lines(self):
            watching.set()
            release.wait(30)
            return iter(())

        def close(self) -> None:
            pass

    watches = PodWatches(list_call, lambda namespace, version: Blocking())
    try:
        watches.lookup("team-a", "p-0", "u0")
        assert watching.wait(10)
        assert seen and seen[0]() is None, "the list is still referenced while its watch runs"
        assert watches.lookup("team-a", "p-0", "u0") == {
            "apiVersion": "v1", "kind": "Pod", "metadata": pod["metadata"], "spec": {}}
    finally:
        release.set()
        watches.stop()


def test_a_list_as_the_api_server_sent_it_is_decoded_with_the_collector_paused_and_left_on_after():
    """The cluster authority hands the list over as bytes: decoded, slimmed and freed with the cyclic collector
    off (its collections only walked the list's live objects: half of a large list's CPU), and on again after."""
    import gc
    import json

    from trainhook.webhook.notary.pod_watch import listed_pods

    pod = {"metadata": {"name": "p-0", "uid": "u0", "labels": {"trainhook.dev/job-name": "g"}},
           "spec": {"hostname": "p-0", "containers": [{"name": "c"}]}, "status": {"phase": "Running"}}
    raw = json.dumps({"metadata": {"resourceVersion": "7"}, "items": [pod] * 3000}).encode()
    collections: list[int] = []

    def count(phase: str, info: dict) -> None:
        if phase == "start":
            collections.append(info["generation"])

    assert gc.isenabled()
    gc.callbacks.append(count)
    try:
        pods, version = listed_pods(raw)
        during = list(collections)
        listed_pods(json.loads(raw))  # a decoded list (the tests' fakes): no pause, the collector runs as always
    finally:
        gc.callbacks.remove(count)
    assert during == [], f"collections while the list was decoded: {during}"
    assert len(collections) > len(during), "no collection after the pause: the collector was left off"
    assert gc.isenabled() and version == "7"
    assert pods == {"p-0": {"apiVersion": "v1", "kind": "Pod", "metadata": pod["metadata"],
                            "spec": {"hostname": "p-0"}}}
