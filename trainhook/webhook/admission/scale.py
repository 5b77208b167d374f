"""Whether a gang's workload may change size in place: `kubectl scale`, an HPA, a Job's parallelism.

A gang's shape is stamped on its pod template at the workload's admission, and every pod is wired for it
(`WORLD_SIZE`, ranks, peers). The `scale` subresource changes `spec.replicas` without passing through that
admission, so the template keeps the old shape and the StatefulSet controller's new pods are refused at their
own admission, over and over, out of the user's sight (issue 18). Refusing the scale itself, with the fix,
puts the message where the user typed the command. An elastic PyTorch gang (`trainhook.dev/elastic: min:max`)
is the exception: it is wired for any size within its range (torchrun's c10d rendezvous forms the world), so
it may be scaled anywhere in min..max.

`check_scale` is pure: the webhook calls it with the StatefulSet from its watch cache (admission makes no
API call), `trainhook local scale` with the object it keeps.
"""

from __future__ import annotations

from trainhook.gang import keys
from trainhook.gang.lookup import setting
from trainhook.gang.shape import ShapeError, parse_range, parse_shape
from trainhook.webhook.admission.frameworks import is_elastic
from trainhook.webhook.admission.member import Problems
from trainhook.webhook.admission.workloads import identity_labels, template_labels

# The field a scale changes, per workload kind.
SIZE_FIELD = {"StatefulSet": "spec.replicas", "Job": "spec.parallelism"}


def is_gang(workload: dict) -> bool:
    """A workload trainhook wired: the framework label on the workload itself (the webhook's gate), or only on its
    template (a workload the webhook never saw, e.g. created while it was down, is still a gang to its pods)."""
    own = (workload.get("metadata") or {}).get("labels") or {}
    return keys.FRAMEWORK in own or keys.FRAMEWORK in template_labels(workload)


def current_size(workload: dict) -> int:
    """The size the workload has now: a StatefulSet's replicas (the API's default 1), a Job's parallelism."""
    spec = workload.get("spec") or {}
    if workload.get("kind") == "Job":
        return int(spec.get("parallelism", spec.get("completions", 1)) or 0)
    return int(spec.get("replicas", 1) if spec.get("replicas") is not None else 1)


def stamped_count(workload: dict, role: str) -> tuple[str | None, int | None, int]:
    """(the stamped `trainhook.dev/replicas` text, this role's count in it, the other roles' total); the counts are
    None and 0 when the text does not parse."""
    text = setting(workload, keys.REPLICAS)  # the template's (the webhook's stamp), as the pods see it
    if text is None:
        return None, None, 0
    try:
        shape = parse_shape(text)
    except ShapeError:
        return text, None, 0
    mine = shape.count(role) if role in shape.roles else None
    return text, mine, shape.size - shape.count(role)


def check_scale(workload: dict, new_replicas: int) -> str | None:
    """None when `workload` may go to `new_replicas` members in place, else why not and what to do instead.

    Allowed: anything for a workload that is not a gang; no change; 0 (the launcher scales a finished gang to
    zero, and a user may stop one); from 0 back to the stamped size (rerunning a finished gang); an elastic gang
    anywhere its whole size stays within min..max. Anything else would leave the running pods wired for the old
    size and the new ones refused, so it is refused here.
    """
    if not is_gang(workload):
        return None
    kind = workload.get("kind") or "StatefulSet"
    size_field = SIZE_FIELD.get(kind, "spec.replicas")
    current = current_size(workload)
    if new_replicas == current or new_replicas == 0:
        return None
    labels = identity_labels(workload, Problems())
    framework = labels.get(keys.FRAMEWORK, "")
    role = labels.get(keys.ROLE) or keys.MAIN_ROLE.get(framework, "worker")
    meta = workload.get("metadata") or {}
    name = f"{kind} {meta.get('namespace') or 'default'}/{meta.get('name', '')}"
    text, stamped, others = stamped_count(workload, role)
    elastic_text = setting(workload, keys.ELASTIC) if is_elastic(framework) else None
    if elastic_text is not None:
        try:
            low, high = parse_range(elastic_text)
        except ShapeError:
            return (f"{name}: {keys.ELASTIC}={elastic_text!r} is not an elastic range, so the gang cannot be "
                    f"scaled; write min:max with 1 <= min <= max, e.g. 2:4")
        if low <= others + new_replicas <= high:
            return None
        return (f"{name} is an elastic {framework} gang of {low} to {high} members ({keys.ELASTIC}={elastic_text!r}); "
                f"{size_field}={new_replicas} would make it {others + new_replicas}: scale within {low - others}.."
                f"{high - others}, or widen {keys.ELASTIC} with kubectl apply")
    if current == 0 and stamped is not None and new_replicas == stamped:
        return None  # rerunning a finished gang with the shape its pods were wired for
    members = f"{stamped + others}-member" if stamped is not None else "fixed-size"
    shape = f" ({keys.REPLICAS}={text!r})" if text is not None else ""
    if kind == "Job":
        fix = (f"delete the Job and create it again with spec.completions and spec.parallelism {new_replicas} "
               f"(a Job's completions cannot change), or make it elastic with {keys.ELASTIC}: min:max")
    else:
        fix = (f"change spec.replicas with kubectl apply (the gang restarts with the new shape) or make it elastic "
               f"with {keys.ELASTIC}: min:max")
    return (f"{name} is a {members} {framework} gang{shape}; kubectl scale cannot change a running gang's size "
            f"({size_field} {current} -> {new_replicas}): {fix}")
