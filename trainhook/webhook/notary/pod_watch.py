"""Gang members' pods, read from one list+watch per namespace instead of a GET per credential (issue 32 item 3).

Why: every credential call read the requesting pod afresh (it must still exist, with the token's uid: that is
what makes a deleted pod's token stop working). At 10,000 members that was 10,000 GETs in one burst. Here the
notary keeps, per namespace it serves, a list+watch of the pods labeled `trainhook.dev/job-name` (every gang pod
carries it: the webhook stamps it), slimmed to what the membership decision reads, and a credential call reads
its pod from there: a gang's credentials cost a list and a watch, whatever its size.

Why it keeps every property of a fresh read: a watch delivers each change in the order etcd committed it, and
milliseconds after it; the copy is used only while the watch is connected and has listed (otherwise a GET), and
only when it holds the token's pod with the token's uid; a pod it does not hold (created since the last event,
or gone) is read with a GET, so a refusal is always decided on a fresh read. A deleted pod's DELETED event drops
it, so its token is refused from then on. Only credential calls read the watch; records and events (rank 0's
coordinator, once per gang) read the pod afresh as before.

A namespace's first list takes a while for a large gang (10,000 pods: seconds on a loaded API server), and a
gang's members all ask at once, at its start: a credential call that finds the namespace's first list under way
waits for it (at most FIRST_LIST_WAIT seconds, on the event loop, no thread held) and then reads the list, instead
of a GET each (issue 32: 230-330 GETs at 10,000 members before, 0.03 API calls a member).

Bounds: at most MAX_NAMESPACES watched at once (beyond that, GETs); a namespace nobody asked about for IDLE
seconds stops being watched; a watch is started only for a pod whose token verified (a caller who cannot make a
valid token for a namespace cannot make the notary watch it).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from trainhook.gang import keys
from trainhook.webhook.admission.jsontext import parse_body

log = logging.getLogger("trainhook.webhook.notary")

MAX_NAMESPACES = 64
IDLE = 600.0  # seconds without a lookup before a namespace's watch stops
WATCH_SECONDS = 300  # a watch is reopened this often (the API server ends long watches anyway)
RETRY_SECONDS, MAX_RETRY_SECONDS = 2.0, 120.0  # doubling while it keeps failing (a watch RBAC refuses)
LIST_TIMEOUT = 60
FIRST_LIST_WAIT = 5.0  # seconds a credential call waits for its namespace's first list before it GETs its pod


def slim(pod: dict) -> dict:
    """What the membership decision reads of a pod (webhook/notary/membership.py, admission/pods.py `member_of`):
    its identity, labels, annotations, controller, hostname, subdomain and ServiceAccount; no status, no
    containers, no managed fields (a 10,000-pod gang is then a few MB, not hundreds)."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    kept_meta = {k: meta[k] for k in ("name", "namespace", "uid", "labels", "annotations", "ownerReferences",
                                      "deletionTimestamp", "resourceVersion") if k in meta}
    kept_spec = {k: spec[k] for k in ("hostname", "subdomain", "serviceAccountName") if k in spec}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": kept_meta, "spec": kept_spec}


class NamespacePods:
    """One namespace's gang pods by name, kept by a list+watch on its own thread. Written by that thread only,
    each write replaces a whole entry (or the whole dict): a reader sees a pod before or after a change."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.pods: dict[str, dict] = {}
        self.live = False  # listed, and the watch since is connected: only then is the copy used
        self.used = time.monotonic()
        self.stop = threading.Event()
        self.lists = 0  # lists and watches opened: the API calls this namespace costs (tests, bench)
        self.watches = 0
        self.first_done = threading.Event()  # the first list has ended (listed and watching, or failed)
        self._wake: set[Callable[[], None]] = set()  # who waits for the first list (a timed-out waiter leaves)
        self._wake_lock = threading.Lock()

    def end_first_list(self) -> None:
        """The first list has ended, either way: wake whoever waits for it (once)."""
        with self._wake_lock:
            if self.first_done.is_set():
                return
            self.first_done.set()
            wake, self._wake = self._wake, set()
        for one in wake:
            one()

    async def first_list(self, timeout: float) -> None:
        """Wait (on the event loop) until the first list has ended, at most `timeout` seconds."""
        loop = asyncio.get_running_loop()
        ended = loop.create_future()

        def settle() -> None:
            if not ended.done():
                ended.set_result(None)

        def wake() -> None:
            try:
                loop.call_soon_threadsafe(settle)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass
        with self._wake_lock:
            if self.first_done.is_set():
                return
            self._wake.add(wake)
        try:
            await asyncio.wait_for(ended, timeout)
        except TimeoutError:  # not woken: take the callback back (a list that hangs would otherwise keep them all)
            with self._wake_lock:
                self._wake.discard(wake)

    def get(self, name: str, uid: str) -> dict | None:
        """The pod when the watch is live and holds it with `uid`; None: read it with a GET."""
        self.used = time.monotonic()
        pod = self.pods.get(name) if self.live else None
        if pod is None or (pod.get("metadata") or {}).get("uid") != uid:
            return None
        return pod

    def apply(self, kind: str, pod: dict) -> None:
        name = (pod.get("metadata") or {}).get("name", "")
        if kind == "DELETED":
            self.pods.pop(name, None)
        else:
            self.pods[name] = slim(pod)


def listed_pods(listed: dict | bytes) -> tuple[dict[str, dict], str]:
    """A list's pods by name, slimmed, and its resourceVersion. A function of its own so that the list itself is
    freed on return: held in `run`'s frame it lived as long as the watch after it (minutes), a 10,000-pod list with
    every pod's containers and status, ~400,000 objects that each full garbage collection walked (1.3-1.5 s of the
    notary's CPU while a 10,000-member gang got its keys).

    The API server's answer as it came (bytes) is decoded, slimmed and freed with the collector paused
    (`collector_paused`): every object the decoding makes is alive until the slimming is done, so a collection
    meanwhile only walks them, and half of a large list's decoding CPU was such collections (a 2,000-pod list,
    13.8 MB: 0.15-0.18 s decoded with the collector, 0.08-0.09 s without)."""
    if isinstance(listed, bytes):
        with collector_paused():
            return _slimmed(parse_body(listed))
    return _slimmed(listed)


def _slimmed(listed: dict) -> tuple[dict[str, dict], str]:
    pods = {(p.get("metadata") or {}).get("name", ""): slim(p) for p in listed.get("items") or []}
    return pods, (listed.get("metadata") or {}).get("resourceVersion", "")


@contextlib.contextmanager
def collector_paused():
    """The cyclic garbage collector off for the block, for every thread of the process (the event loop's too, for
    the fraction of a second a list's decoding takes: what it allocates meanwhile is collected afterwards). Only
    the block that turned it off turns it on again, so two namespaces' lists at once never leave it off."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


Call = Callable[..., Any]  # the authority's blocking call: (method, path, query, stream) -> decoded JSON or response


def run(pods: NamespacePods, list_call: Callable[[], dict | bytes], watch_call: Callable[[str], Any]) -> None:
    """Keep `pods` current until its stop is set (or it has been idle IDLE seconds): list, then watch from the
    list's version; on any failure mark it not live (callers GET meanwhile) and list again."""
    failures = 0
    while not pods.stop.is_set():
        if time.monotonic() - pods.used > IDLE:
            pods.stop.set()
            break
        try:
            pods.live = False
            pods.lists += 1
            pods.pods, version = listed_pods(list_call())
            while not pods.stop.is_set() and time.monotonic() - pods.used <= IDLE:
                pods.watches += 1
                response = watch_call(version)
                try:
                    pods.live, failures = True, 0
                    pods.end_first_list()
                    for line in response.stream_lines():
                        event = parse_body(line)
                        obj = event.get("object") or {}
                        if event.get("type") == "ERROR":
                            raise RuntimeError(f"watch error: {obj.get('message', obj)}")
                        version = (obj.get("metadata") or {}).get("resourceVersion") or version
                        if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                            pods.apply(event["type"], obj)
                        if pods.stop.is_set():
                            break
                finally:
                    response.close()
        except Exception as e:  # noqa: BLE001  network, 410 Gone, RBAC: GETs meanwhile, list again
            pods.live, failures = False, failures + 1
            pods.end_first_list()
            log.warning("gang pod watch interrupted; listing again", extra={"namespace": pods.namespace,
                                                                             "error": str(e)})
            pods.stop.wait(min(MAX_RETRY_SECONDS, RETRY_SECONDS * 2 ** (failures - 1)))
    pods.live = False
    pods.end_first_list()


class PodWatches:
    """The namespaces' watches, started on demand (see the module docstring for the bounds)."""

    def __init__(self, list_call: Callable[[str], dict | bytes], watch_call: Callable[[str, str], Any],
                 max_namespaces: int = MAX_NAMESPACES) -> None:
        self.list_call, self.watch_call, self.max_namespaces = list_call, watch_call, max_namespaces
        self.watched: dict[str, NamespacePods] = {}
        self.lock = threading.Lock()

    def lookup(self, namespace: str, name: str, uid: str) -> dict | None:
        """The pod from its namespace's watch (starting one if there is room), or None: GET it."""
        with self.lock:
            pods = self.watched.get(namespace)
            if pods is None or pods.stop.is_set():
                for stale in [ns for ns, p in self.watched.items() if p.stop.is_set()]:
                    del self.watched[stale]
                if len(self.watched) >= self.max_namespaces:
                    return None
                pods = self.watched[namespace] = NamespacePods(namespace)
                threading.Thread(target=run, args=(pods, lambda: self.list_call(namespace),
                                                   lambda version: self.watch_call(namespace, version)),
                                 name=f"notary-pods-{namespace}", daemon=True).start()
        return pods.get(name, uid)

    async def first_list(self, namespace: str, timeout: float = FIRST_LIST_WAIT) -> bool:
        """True when the namespace's first list was under way and has been waited for (look up again); False when
        there was nothing to wait for (no watch, or it has listed before: a pod it lacks is read with a GET)."""
        pods = self.watched.get(namespace)
        if pods is None or pods.first_done.is_set():
            return False
        await pods.first_list(timeout)
        return True

    def api_calls(self) -> int:
        return sum(p.lists + p.watches for p in self.watched.values())

    def stop(self) -> None:
        for pods in self.watched.values():
            pods.stop.set()


SELECTOR = keys.JOB_NAME  # every pod with the label (any gang)
