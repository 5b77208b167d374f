"""A gang's Kubernetes Events, for Trainer v2's `get_job_events` and Kubeflow v1's `get_job_logs(verbose=True)`.

A gang is plain objects, so its events are those whose involved object is one of its workloads, its Service or
PodGroup (named as the gang), or one of its pods, including pods already deleted (a finished StatefulSet gang is
scaled to zero; its pods' events outlive them): those are matched by the names their workload gives its pods.
"""

from __future__ import annotations

import re

from trainhook.sdk.conditions import parse_time
from trainhook.sdk.trainer_types import Event


def pod_name_pattern(workloads: list[dict], pods: list[dict]) -> re.Pattern:
    """Names of the gang's pods, present or gone: <statefulset>-<ordinal>, <job>-<index>-<5 characters>."""
    parts = [rf"{re.escape(w['metadata']['name'])}-\d+" if w.get("kind") == "StatefulSet"
             else rf"{re.escape(w['metadata']['name'])}-\d+-[a-z0-9]{{5}}" for w in workloads]
    parts += [re.escape(p["metadata"]["name"]) for p in pods]
    return re.compile("|".join(parts) or "(?!)")


def gang_events(name: str, workloads: list[dict], pods: list[dict], events: list[dict]) -> list[Event]:
    """The events (API server dicts) about the gang's objects, oldest first."""
    owned = {(w.get("kind", ""), w["metadata"]["name"]) for w in workloads}
    pod_names = pod_name_pattern(workloads, pods)
    found = []
    for event in events:
        involved = event.get("involvedObject") or {}
        kind, obj = involved.get("kind", ""), involved.get("name", "")
        if (kind, obj) in owned or (kind in ("Service", "PodGroup") and obj == name) or \
                (kind == "Pod" and pod_names.fullmatch(obj)):
            when = event.get("eventTime") or event.get("firstTimestamp") or event.get("lastTimestamp") or \
                (event.get("metadata") or {}).get("creationTimestamp")
            found.append(Event(kind, obj, event.get("message", ""), event.get("reason", ""), parse_time(when)))
    return sorted(found, key=lambda e: (e.event_time is None, e.event_time.timestamp() if e.event_time else 0.0))


def read_events(cluster, name: str) -> list[Event]:
    """The gang's events, read from the cluster now (a trainhook.cluster.client.Cluster)."""
    from kubernetes.client.exceptions import ApiException

    from trainhook.cluster.client import api_error

    objects = cluster.gang(name)
    try:
        answer = cluster._call(cluster.core.list_namespaced_event, cluster.namespace)  # its timeouts and errors
    except ApiException as e:
        raise api_error(e, "events") from e
    return gang_events(name, objects.workloads, objects.pods, answer.get("items") or [])
