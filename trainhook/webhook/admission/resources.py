"""Resources: the extended ones (`nvidia.com/gpu`, ...) of a workload's pod template, checked at the workload's
admission, and those of the container trainhook injects into a pod, chosen so the pod keeps its QoS class.

Kubernetes validates them only when a pod is created, not in a StatefulSet's or Job's template: `nvidia.com/gpu:
500m` is accepted at `kubectl apply`, then every pod creation fails (FailedCreate `must be an integer`) and nothing
shows on the workload. The webhook refuses the workload instead, naming the field, with the API server's own rules
for an extended resource (pkg/apis/core/validation): a whole, non-negative quantity; a request needs a limit and
equals it (extended resources are never overcommitted).

The gang-wait init container (`wait_resources`): a Guaranteed pod stays Guaranteed only if every container,
init containers included, has limits equal to its requests for CPU and memory. Requests below their limits made
every labeled Guaranteed pod Burstable, losing the static CPU manager's exclusive cores and its eviction order. Its
CPU limit is up to a whole core, not 100m: its work (a Python start, the launcher's copy, the wait) is ~0.1 s of
CPU in one burst at the pod's start, which a 100m CFS quota stretched to a second or more on every pod, idle node
or not.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal, InvalidOperation

from trainhook.webhook.admission.member import Problems

# resource.Quantity: a signed decimal number, then a binary suffix, a decimal suffix or an exponent.
QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))([KMGTPE]i|[numkMGTPE]|[eE][+-]?\d+)?$")
BINARY = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60}
DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "k": Decimal(10) ** 3,
           "M": Decimal(10) ** 6, "G": Decimal(10) ** 9, "T": Decimal(10) ** 12, "P": Decimal(10) ** 15,
           "E": Decimal(10) ** 18}


def quantity(value: object) -> Decimal | None:
    """A resource.Quantity's value (an int or float from YAML, or its string form), or None if it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        value = repr(value)
    match = QUANTITY.match(value) if isinstance(value, str) else None
    if match is None:
        return None
    try:
        number, suffix = Decimal(match[1]), match[2] or ""
    except InvalidOperation:
        return None
    if suffix in BINARY:
        return number * BINARY[suffix]
    if suffix in DECIMAL:
        return number * DECIMAL[suffix]
    return number * (Decimal(10) ** int(suffix[1:])) if suffix else number


# The gang-wait container's resources: requests 10m CPU and 32Mi (it makes a BestEffort pod Burstable: an injected
# container is always bounded), memory limited to 128Mi, and CPU limited to what the pod's containers are limited to
# in all, within WAIT_CPU (a whole core when one of them has no CPU limit). Within that sum it changes neither the
# pod's effective limit, which a ResourceQuota on limits.cpu charges, nor, in a Guaranteed pod, where its requests
# equal its limits, the pod's effective request (the larger of its containers' sum and any init container's).
WAIT_REQUESTS = {"cpu": "10m", "memory": "32Mi"}
WAIT_MEMORY = "128Mi"
WAIT_CPU = (Decimal("0.1"), Decimal(1))
QOS = ("cpu", "memory")


def section_of(container: object, section: str) -> dict:
    """A container's resources.limits or resources.requests ({} when absent or not an object)."""
    resources = container.get("resources") if isinstance(container, dict) else None
    found = resources.get(section) if isinstance(resources, dict) else None
    return found if isinstance(found, dict) else {}


def container_guaranteed(container: object) -> bool:
    """Kubernetes' Guaranteed test for one container: CPU and memory limits, and requests (defaulted from the
    limits when absent) equal to them."""
    limits, requests = section_of(container, "limits"), section_of(container, "requests")
    for name in QOS:
        limit = quantity(limits.get(name))
        if limit is None or (name in requests and quantity(requests[name]) != limit):
            return False
    return True


def wait_cpu(spec: dict) -> str:
    """The wait's CPU limit: the sum of the pod's containers' CPU limits within WAIT_CPU, or its top when one of
    them has none (the pod's CPU is not limited then)."""
    low, high = WAIT_CPU
    found = [quantity(section_of(c, "limits").get("cpu")) for c in spec.get("containers") or []]
    limits = [limit for limit in found if limit is not None]
    total = high if not found or len(limits) < len(found) else min(max(sum(limits, Decimal(0)), low), high)
    millis = int(total * 1000)
    return f"{millis // 1000}" if millis % 1000 == 0 else f"{millis}m"


def wait_resources(spec: dict, configured: dict | None = None) -> dict:
    """The gang-wait init container's resources in a pod of `spec`: `configured` (the chart's gangWaitResources,
    checked by parse_wait_resources) or the defaults above, its limits as requests too in a Guaranteed pod, which
    so stays Guaranteed. None when the pod has pod-level resources (`spec.resources`, Kubernetes 1.32+): the pod's
    own budget then bounds every container, ours included."""
    if spec.get("resources"):
        return {}
    limits = dict(configured["limits"]) if configured else {"cpu": wait_cpu(spec), "memory": WAIT_MEMORY}
    containers = [c for field in ("containers", "initContainers") for c in spec.get(field) or []]
    if containers and all(container_guaranteed(c) for c in containers):
        return {"requests": dict(limits), "limits": limits}
    requests = dict(configured.get("requests") or {}) if configured else dict(WAIT_REQUESTS)
    return {"requests": requests, "limits": limits} if requests else {"limits": limits}


def parse_wait_resources(text: str) -> dict:
    """The chart's gangWaitResources (JSON; empty or {}: the defaults) as wait_resources takes it; ValueError
    naming what is wrong. Its limits must bound CPU and memory (a Guaranteed pod's wait gets them as requests too),
    and no request may pass its limit (the API server would refuse every pod)."""
    try:
        value = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as e:
        raise ValueError(f"gangWaitResources is not JSON: {e}") from e
    if not isinstance(value, dict) or not set(value) <= {"requests", "limits"}:
        raise ValueError(f"gangWaitResources must be an object with requests and limits only, not {text.strip()}")
    if not value:
        return {}
    parsed: dict[str, dict[str, Decimal]] = {}
    for section in ("requests", "limits"):
        items = value.get(section) or {}
        if not isinstance(items, dict):
            raise ValueError(f"gangWaitResources.{section} must be an object of resource: quantity")
        for name, text_value in items.items():
            amount = quantity(text_value)
            if amount is None or amount < 0:
                raise ValueError(f"gangWaitResources.{section}.{name}={text_value!r} is not a quantity "
                                 "(e.g. 500m, 1, 128Mi)")
            parsed.setdefault(section, {})[name] = amount
            items[name] = str(text_value)
    missing = [name for name in QOS if name not in parsed.get("limits", {})]
    if missing:
        raise ValueError(f"gangWaitResources.limits must give {' and '.join(missing)}: the wait's container is "
                         "bounded, and a Guaranteed pod's wait gets its limits as requests")
    for name, request in parsed.get("requests", {}).items():
        limit = parsed["limits"].get(name)
        if limit is not None and request > limit:
            raise ValueError(f"gangWaitResources.requests.{name}={value['requests'][name]} is more than its limit "
                             f"{value['limits'][name]}: the API server would refuse every pod")
    return value


def is_extended(name: str) -> bool:
    """Kubernetes' IsExtendedResourceName: a domain-prefixed name outside kubernetes.io (and not a quota's
    `requests.` name), e.g. nvidia.com/gpu, amd.com/gpu, rdma/hca."""
    return "/" in name and "kubernetes.io/" not in name and not name.startswith("requests.")


def check_container(path: str, container: dict, problems: Problems) -> None:
    sections = {section: section_of(container, section) for section in ("limits", "requests")}
    values: dict[str, dict[str, Decimal]] = {"limits": {}, "requests": {}}
    for section, items in sections.items():
        for name, text in items.items():
            if not isinstance(name, str) or not is_extended(name):
                continue
            field = f"{path}.resources.{section}.{name}"
            value = quantity(text)
            if value is None or value < 0 or value != value.to_integral_value():
                problems.add(field, text, "an extended resource is a whole number of devices: the API server would "
                             "refuse every pod (FailedCreate: must be an integer)",
                             "use a whole number, e.g. 1 (a fraction of a GPU needs a device plugin's own resource "
                             "name, such as time-slicing or MIG)")
                continue
            values[section][name] = value
    for name, request in values["requests"].items():
        limit = values["limits"].get(name)
        field = f"{path}.resources.requests.{name}"
        if name not in sections["limits"]:
            problems.add(field, sections["requests"][name], "an extended resource needs a limit (it is never "
                         "overcommitted): the API server would refuse every pod", f"set resources.limits.{name} to "
                         "the same value, or give the limit alone")
        elif limit is not None and limit != request:
            problems.add(field, sections["requests"][name], f"differs from the limit "
                         f"({sections['limits'][name]}): the API server would refuse every pod",
                         "make request and limit equal, or give the limit alone")


def check_extended_resources(template: dict, problems: Problems) -> None:
    """Every container's and init container's extended resources in a workload's pod template."""
    spec = template.get("spec") if isinstance(template, dict) else None
    if not isinstance(spec, dict):
        return
    for field in ("initContainers", "containers"):
        for container in spec.get(field) or []:
            name = container.get("name", "") if isinstance(container, dict) else ""
            check_container(f"spec.template.spec.{field}[{name}]", container, problems)
