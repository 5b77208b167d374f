"""Which of the chart's tolerations (its `tolerations` value) a training pod gets (issue 23 item 6).

Why they are scoped: a toleration lets a pod onto tainted nodes (a GPU pool kept for training), and the webhook
adds them to any pod that carries the trainhook label, which anyone who may create a pod can write (with
`trainhook.dev/launcher: none` it need not even be a working gang). Added to every labeled pod in every
namespace, the chart's tolerations were a way onto the pool for every namespace. So an entry is added only:
- in the namespaces the chart names for them (`tolerationNamespaces`, TRAINHOOK_WEBHOOK_TOLERATION_NAMESPACES);
  none named: nowhere. `*` names every namespace the webhook serves (the old behaviour, chosen on purpose);
- and, when the entry says `requiresResource: <resource>`, only to a pod one of whose containers (or init
  containers) requests or limits that resource: a taint that guards GPUs then admits the pods that use them.

The `nvidia.com/gpu` toleration of a pod that requests GPUs is not the chart's and stays everywhere
(webhook/admission/pods.py): it is what Kubernetes' own ExtendedResourceToleration admission plugin gives such a pod.

Admission makes no API call: the namespace is the review's own, the rest is the pod's spec.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

REQUIRES_RESOURCE = "requiresResource"  # trainhook's own key in an entry; never written into a pod
EVERY_NAMESPACE = "*"
# A resource name as Kubernetes writes one: an optional DNS-subdomain prefix and a name (nvidia.com/gpu, cpu).
RESOURCE_NAME = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
# A quantity above zero: a digit 1-9 before any unit (1, 500m, 0.5, 2Gi; not 0, 0m, 0.0).
NON_ZERO = re.compile(r"^\+?0*\.?0*[1-9]")


def check_entries(entries: Iterable[dict]) -> None:
    """Raise ValueError naming the entry and the fix when an entry's `requiresResource` is not a resource name."""
    for index, entry in enumerate(entries):
        if REQUIRES_RESOURCE not in entry:
            continue
        value = entry[REQUIRES_RESOURCE]
        if not isinstance(value, str) or not RESOURCE_NAME.match(value):
            raise ValueError(f"toleration {index}: {REQUIRES_RESOURCE}={value!r} is not a resource name; name the "
                             f"resource the taint guards, e.g. nvidia.com/gpu")


def parse_namespaces(text: str) -> frozenset:
    """Comma-separated namespace names, or `*` for every namespace the webhook serves."""
    return frozenset(name.strip() for name in text.split(",") if name.strip())


def requests_resource(spec: dict, resource: str) -> bool:
    """Whether a container or init container of the pod requests or limits a non-zero quantity of `resource`."""
    containers = list(spec.get("containers") or []) + list(spec.get("initContainers") or [])
    for container in containers:
        resources = container.get("resources") if isinstance(container, dict) else None
        for section in ("requests", "limits"):
            quantity = ((resources or {}).get(section) or {}).get(resource) if isinstance(resources, dict) else None
            if quantity is not None and NON_ZERO.match(str(quantity).strip()):
                return True
    return False


def applies_in(namespace: str, namespaces: frozenset) -> bool:
    return namespace in namespaces or EVERY_NAMESPACE in namespaces


def chart_tolerations(spec: dict, namespace: str, entries: Iterable[dict], namespaces: frozenset) -> list[dict]:
    """The chart's tolerations this pod gets, as Kubernetes toleration objects (without trainhook's own key)."""
    if not applies_in(namespace, namespaces):
        return []
    found = []
    for entry in entries:
        resource = entry.get(REQUIRES_RESOURCE)
        if resource is not None and not requests_resource(spec, resource):
            continue
        found.append({k: v for k, v in entry.items() if k != REQUIRES_RESOURCE})
    return found
