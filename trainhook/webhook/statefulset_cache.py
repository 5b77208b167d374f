"""The StatefulSets a scale review needs, kept by a list+watch in the background of the webhook server.

Why a cache: the API server's review of `statefulsets/scale` carries an autoscaling/v1 Scale, whose metadata has
only name, namespace, uid, resourceVersion and creationTimestamp (no labels, no annotations, no template), and
admission makes no API call (a slow or failing API server would make every scale wait on it). So the webhook
watches StatefulSets and answers a scale review from what it already knows.

Why filtering here: a label selector sees only the StatefulSet's own labels, but trainhook takes a workload's
framework from the workload or its pod template (docs/use/contract.md section 2), so every StatefulSet is listed and
only gangs are kept, each slimmed to what `check_scale` reads (a few labels and annotations and the size): a
cluster's thousands of unrelated StatefulSets cost one pass over the list, not memory. The list is read in pages
of PAGE_SIZE (`limit`/`continue`), each slimmed before the next is asked for, so the full list is never held at
once (10,000 StatefulSets: docs/develop/performance.md).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from trainhook.gang import keys
from trainhook.webhook.admission.scale import is_gang

log = logging.getLogger("trainhook.webhook.statefulsets")
# What of a gang's labels and annotations check_scale reads.
KEPT_LABELS = (keys.FRAMEWORK, keys.JOB_NAME, keys.ROLE)
KEPT_ANNOTATIONS = (keys.REPLICAS, keys.ELASTIC)
# A watch is reopened this often (the API server ends long watches anyway); a failed list is retried after this.
WATCH_SECONDS = 300
RETRY_SECONDS = 2.0
# StatefulSets per page of the list: a page is parsed whole before it is slimmed.
PAGE_SIZE = 500
# Seconds one page may take (a hung API connection must not stop the cache for good).
LIST_TIMEOUT = 60


def _pick(mapping: Any, wanted: tuple[str, ...]) -> dict:
    return {k: mapping[k] for k in wanted if k in mapping} if isinstance(mapping, dict) else {}


def slim(sts: dict) -> dict | None:
    """What check_scale needs of a StatefulSet, or None when it is not a trainhook gang."""
    if not isinstance(sts, dict) or not is_gang(sts):
        return None
    meta = sts.get("metadata") or {}
    spec = sts.get("spec") or {}
    template_meta = (spec.get("template") or {}).get("metadata") or {}
    return {
        "kind": "StatefulSet",
        "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"),
                     "labels": _pick(meta.get("labels"), KEPT_LABELS),
                     "annotations": _pick(meta.get("annotations"), KEPT_ANNOTATIONS)},
        "spec": {"replicas": spec.get("replicas", 1),
                 "template": {"metadata": {"labels": _pick(template_meta.get("labels"), KEPT_LABELS),
                                           "annotations": _pick(template_meta.get("annotations"),
                                                                KEPT_ANNOTATIONS)}}},
    }


class StatefulSetCache:
    """Gang StatefulSets by (namespace, name). Written by one watch thread, read by reviews: every write replaces
    a whole entry (or the whole dict), so a reader sees an entry before or after a change, never half of one."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], dict] = {}
        self.synced = False  # a full list has been read: an absent StatefulSet is then known not to be a gang

    def get(self, namespace: str, name: str) -> dict | None:
        return self._entries.get((namespace, name))

    def __len__(self) -> int:
        return len(self._entries)

    def replace(self, items) -> None:
        """The result of a list (any iterable, e.g. pages read one at a time): everything known is what it says."""
        entries = {}
        for item in items:
            kept = slim(item)
            if kept is not None:
                entries[kept["metadata"]["namespace"], kept["metadata"]["name"]] = kept
        self._entries = entries
        self.synced = True

    def apply(self, event_type: str, obj: dict) -> None:
        """One watch event (ADDED, MODIFIED, DELETED); a StatefulSet whose label went away is dropped."""
        meta = (obj or {}).get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        kept = slim(obj) if event_type != "DELETED" else None
        if kept is None:
            self._entries.pop(key, None)
        else:
            self._entries[key] = kept


def list_and_watch(cache: StatefulSetCache, api_client, stop: threading.Event) -> None:
    """Keep `cache` current until `stop` is set: list every StatefulSet, then watch from the list's version;
    relist when the watch breaks or its version expired (410). Errors are logged and retried, never raised: the
    webhook keeps serving (an unchecked scale is allowed with a warning until the cache is back)."""
    from kubernetes import client, watch
    apps = client.AppsV1Api(api_client)
    while not stop.is_set():
        try:
            listed: dict = {}
            cache.replace(list_pages(apps, listed))
            version = listed.get("resourceVersion")
            log.info("statefulsets listed", extra={"gangs": len(cache), "listed": listed.get("count")})
            while not stop.is_set():
                watcher = watch.Watch()
                for event in watcher.stream(apps.list_stateful_set_for_all_namespaces, resource_version=version,
                                            timeout_seconds=WATCH_SECONDS, allow_watch_bookmarks=True):
                    raw = event.get("raw_object") or {}
                    if event.get("type") == "ERROR":
                        raise RuntimeError(f"watch error: {raw.get('message', raw)}")
                    version = (raw.get("metadata") or {}).get("resourceVersion") or version
                    if event.get("type") != "BOOKMARK":
                        cache.apply(event["type"], raw)
                    if stop.is_set():
                        watcher.stop()
                        break
        except Exception as e:  # noqa: BLE001  any failure (network, 410 Gone, RBAC): say why, list again
            log.warning("statefulset watch interrupted; listing again", extra={"error": str(e)})
            stop.wait(RETRY_SECONDS)


def list_pages(apps, listed: dict):
    """Every StatefulSet, PAGE_SIZE at a time (`limit`/`continue`: one consistent snapshot); fills `listed` with
    the snapshot's resourceVersion (to watch from) and the count. An expired continue token (410) raises: the
    caller lists again."""
    token, listed["count"] = None, 0
    while True:
        response = apps.list_stateful_set_for_all_namespaces(limit=PAGE_SIZE, _continue=token, _preload_content=False,
                                                             _request_timeout=LIST_TIMEOUT)
        page = json.loads(response.data)
        metadata = page.get("metadata") or {}
        listed["resourceVersion"] = metadata.get("resourceVersion")
        items = page.get("items") or []
        listed["count"] += len(items)
        del page, response
        yield from items
        token = metadata.get("continue")
        if not token:
            return


def start_background(cache: StatefulSetCache, api_client) -> tuple[threading.Thread, threading.Event]:
    """The watch thread (a daemon: the kubernetes client blocks, and must not hold up the server's exit)."""
    stop = threading.Event()
    thread = threading.Thread(target=list_and_watch, args=(cache, api_client, stop), name="statefulset-watch",
                              daemon=True)
    thread.start()
    return thread, stop


def wait_synced(cache: StatefulSetCache, timeout: float) -> bool:
    """For tests and startup logs: whether the first list arrives within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not cache.synced and time.monotonic() < deadline:
        time.sleep(0.05)
    return cache.synced
