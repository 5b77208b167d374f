"""Gang schedulers: what Kueue, Volcano and the coscheduling plugin read on a gang's pods.

Labels and annotations only: the objects these schedulers need besides (a Volcano or scheduler-plugins
PodGroup with `minMember` = the gang's size) are emitted by `trainhook render` and `convert`, never created by
the webhook, which makes no API calls.
"""

from __future__ import annotations

from trainhook.gang import keys
from trainhook.webhook.admission.member import Member, Problems


def min_available(member: Member, problems: Problems) -> int:
    text = member.option(keys.MIN_AVAILABLE, str(member.shape.size))
    if not text.isdigit() or not 1 <= int(text) <= member.shape.size:
        problems.add(keys.MIN_AVAILABLE, text, f"not a pod count from 1 to the gang's {member.shape.size}",
                     "drop it to require the whole gang, or give a number in that range")
        return member.shape.size
    return int(text)


def set_scheduler_name(spec: dict, name: str, problems: Problems) -> None:
    current = spec.get("schedulerName", "default-scheduler")
    if current not in ("default-scheduler", name):
        problems.add("spec.schedulerName", current, f"the gang scheduler needs {name}",
                     f"drop spec.schedulerName or set it to {name}")
    spec["schedulerName"] = name


def set_priority_class(spec: dict, wanted: str, warnings: list[str]) -> None:
    """Workload templates get the class at their own admission, so the API server's Priority plugin resolves
    it when the controller creates each pod. A bare pod gets it here, after that plugin already filled in the
    no-class `priority` and `preemptionPolicy`: those are dropped, so its re-invocation computes the class's."""
    if not wanted:
        return
    if "priorityClassName" not in spec:
        spec["priorityClassName"] = wanted
        spec.pop("priority", None)
        spec.pop("preemptionPolicy", None)
    elif spec["priorityClassName"] != wanted:
        warnings.append(f"spec.priorityClassName: kept your {spec['priorityClassName']}; "
                        f"{keys.PRIORITY_CLASS} asks for {wanted}")


def writable_metadata(pod: dict) -> tuple[dict, dict]:
    """New metadata, labels and annotations for the pod, to write into: the pod mutation shares the review's
    own (see `pods.writable`), which must stay as they came."""
    meta = pod["metadata"] = dict(pod["metadata"])
    labels = meta["labels"] = dict(meta.get("labels") or {})
    annotations = meta["annotations"] = dict(meta.get("annotations") or {})
    return labels, annotations


def set_gang_scheduling(pod: dict, member: Member, problems: Problems, warnings: list[str]) -> None:
    """Label the pod for its gang scheduler (when `gang-scheduler` names one)."""
    scheduler = member.option(keys.GANG_SCHEDULER)
    spec = pod["spec"]
    set_priority_class(spec, member.option(keys.PRIORITY_CLASS), warnings)
    if not scheduler:
        return
    if scheduler not in keys.GANG_SCHEDULERS:
        problems.add(keys.GANG_SCHEDULER, scheduler, "unknown gang scheduler",
                     f"use one of {', '.join(keys.GANG_SCHEDULERS)}")
        return
    minimum = min_available(member, problems)
    queue = member.option(keys.QUEUE)
    labels, annotations = writable_metadata(pod)
    if scheduler == "kueue":
        if not queue:
            problems.add(keys.QUEUE, None, "Kueue admits pods through a LocalQueue",
                         f"set the annotation {keys.QUEUE} to a LocalQueue of the namespace")
            return
        if minimum != member.shape.size:
            warnings.append(f"{keys.MIN_AVAILABLE}={minimum}: Kueue admits a pod group whole, "
                            f"all {member.shape.size} pods")
        labels.setdefault(keys.KUEUE_QUEUE_NAME, queue)
        labels.setdefault(keys.KUEUE_POD_GROUP_NAME, member.job_name)
        annotations.setdefault(keys.KUEUE_POD_GROUP_TOTAL_COUNT, str(member.shape.size))
    elif scheduler == "volcano":
        set_scheduler_name(spec, keys.VOLCANO_SCHEDULER, problems)
        annotations.setdefault(keys.VOLCANO_GROUP_NAME, member.job_name)
        if queue:
            annotations.setdefault(keys.VOLCANO_QUEUE_NAME, queue)
    else:
        set_scheduler_name(spec, member.option(keys.SCHEDULER_NAME, keys.COSCHEDULING_SCHEDULER), problems)
        labels.setdefault(keys.COSCHEDULING_POD_GROUP, member.job_name)
