"""A training gang as Kubernetes objects: pure functions returning dicts, and their YAML.

A gang is one headless Service named after the job plus one workload per role (a StatefulSet, or an Indexed
Job with `--kind job`), each labeled and annotated as the contract (docs/use/contract.md) asks, so trainhook's
webhook wires it; with a gang scheduler, also the PodGroup that Volcano or the coscheduling plugin needs (the
webhook never creates objects). `gang_objects` is shared by `trainhook render` (trainhook.render.options builds
the pod templates from the CLI's flags first), `trainhook convert` and the SDK.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import yaml

from trainhook.gang import keys

ON_FAILURE, ACTIVE_DEADLINE_SECONDS = keys.ON_FAILURE, keys.ACTIVE_DEADLINE_SECONDS
ON_FAILURE_POLICIES = keys.ON_FAILURE_VALUES
PHASE, PHASE_TIME, PHASE_REASON, EXIT_CODE = keys.PHASE, keys.PHASE_TIME, keys.PHASE_REASON, keys.EXIT_CODE

KINDS = ("statefulset", "job")
# The schedulers' PodGroup objects (the webhook only labels pods; these come from render and convert).
VOLCANO_PODGROUP_API = "scheduling.volcano.sh/v1beta1"
COSCHEDULING_PODGROUP_API = "scheduling.x-k8s.io/v1alpha1"


class RenderError(ValueError):
    """Options that cannot make a working gang; the message names the flag and the fix."""


@dataclass(frozen=True)
class Scheduling:
    """Gang scheduling (issue 10): which scheduler, and Kubeflow's schedulingPolicy fields."""

    scheduler: str
    queue: str = ""
    min_available: int | None = None
    priority_class: str = ""
    scheduler_name: str = ""  # coscheduling only: the scheduler profile's name
    schedule_timeout_seconds: int | None = None  # coscheduling PodGroup only
    min_resources: dict | None = None  # PodGroup spec.minResources (Volcano, coscheduling)


@dataclass
class Gang:
    """A gang's workloads: roles in rank order, each with its replica count and pod template."""

    name: str
    framework: str
    roles: list[tuple[str, int, dict]]  # (role, replicas, pod template with metadata and spec)
    kind: str = "statefulset"
    namespace: str | None = None
    annotations: dict[str, str] = field(default_factory=dict)  # trainhook.dev/ options for every workload
    scheduling: Scheduling | None = None
    # Workloads are named <job>-<role> even for one role (Kubeflow's pod names); a multi-role gang always is.
    role_suffix: bool = False
    active_deadline_seconds: int | None = None  # Indexed Jobs also get it as spec.activeDeadlineSeconds
    # The pods' PriorityClass without a gang scheduler (with one: Scheduling.priority_class).
    priority_class: str = ""


def _meta(name: str, namespace: str | None, labels: dict, annotations: dict | None = None) -> dict:
    meta: dict = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    meta["labels"] = dict(labels)
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def service(name: str, namespace: str | None = None) -> dict:
    """The headless Service every pod address `<host>.<name>` resolves through, before pods are Ready."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": _meta(name, namespace, {keys.JOB_NAME: name}),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": {keys.JOB_NAME: name}}}


def size(gang: Gang) -> int:
    return sum(count for _, count, _ in gang.roles)


def shape(gang: Gang) -> str:
    return ",".join(f"{role}={count}" for role, count, _ in gang.roles)


def workload_name(gang: Gang, role: str) -> str:
    return f"{gang.name}-{role}" if gang.role_suffix or len(gang.roles) > 1 else gang.name


def scheduling_annotations(scheduling: Scheduling | None) -> dict[str, str]:
    if scheduling is None:
        return {}
    found = {keys.GANG_SCHEDULER: scheduling.scheduler, keys.QUEUE: scheduling.queue,
             keys.SCHEDULER_NAME: scheduling.scheduler_name}
    if scheduling.min_available is not None:
        found[keys.MIN_AVAILABLE] = str(scheduling.min_available)
    return {key: value for key, value in found.items() if value}


def set_kueue_pod_group(template_meta: dict, gang: Gang, queue: str) -> None:
    """Kueue's pod-group keys in the template itself (the webhook would add the same): Kueue's own webhook gates
    a pod only if the queue label is there when it sees the pod, whichever webhook runs first."""
    template_meta["labels"].update({keys.KUEUE_QUEUE_NAME: queue, keys.KUEUE_POD_GROUP_NAME: gang.name})
    template_meta.setdefault("annotations", {})[keys.KUEUE_POD_GROUP_TOTAL_COUNT] = str(size(gang))


def workload(gang: Gang, role: str, replicas: int, template: dict) -> dict:
    """One role's StatefulSet or Indexed Job, labeled for the webhook, its template labeled the same.

    The priority class goes into the template itself rather than the `priority-class` annotation: the API
    server's Priority admission plugin resolves it before any webhook runs (a class the webhook adds later is
    refused on reinvocation, the pod already carrying the default priority). Kueue's keys go there too.

    An Indexed Job gets `backoffLimit: 0` whatever the gang's on-failure policy (docs/use/gang-lifecycle.md): retrying
    the gang is its launchers' job (`restart-gang`, at most `max-restarts` times), and a Job retrying one pod on
    its own would start that pod outside the gang, on top of the gang's own restarts."""
    name = workload_name(gang, role)
    labels = {keys.FRAMEWORK: gang.framework, keys.JOB_NAME: gang.name, keys.ROLE: role}
    annotations = dict(gang.annotations)
    annotations.update(scheduling_annotations(gang.scheduling))
    if len(gang.roles) > 1:
        annotations[keys.REPLICAS] = shape(gang)
    template = copy.deepcopy(template)
    tmeta = template.setdefault("metadata", {})
    tmeta["labels"] = {**(tmeta.get("labels") or {}), **labels}
    if gang.scheduling and gang.scheduling.scheduler == "kueue":
        set_kueue_pod_group(tmeta, gang, gang.scheduling.queue)
    spec = template.setdefault("spec", {})
    priority = gang.priority_class or (gang.scheduling.priority_class if gang.scheduling else "")
    if priority:
        spec.setdefault("priorityClassName", priority)
    meta = _meta(name, gang.namespace, labels, annotations)
    if gang.kind == "job":
        spec["restartPolicy"] = spec.get("restartPolicy") if spec.get("restartPolicy") in ("Never", "OnFailure") \
            else "Never"
        job_spec: dict = {"completions": replicas, "parallelism": replicas, "completionMode": "Indexed",
                          "backoffLimit": 0}
        if gang.active_deadline_seconds is not None:
            job_spec["activeDeadlineSeconds"] = gang.active_deadline_seconds
        job_spec["template"] = template
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": job_spec}
    spec["restartPolicy"] = "Always"  # the only value a StatefulSet accepts
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta,
            "spec": {"serviceName": gang.name, "replicas": replicas, "podManagementPolicy": "Parallel",
                     "selector": {"matchLabels": {keys.JOB_NAME: gang.name, keys.ROLE: role}},
                     "template": template}}


def pod_group(scheduling: Scheduling, name: str, namespace: str | None, members: int) -> dict | None:
    """The PodGroup Volcano or the coscheduling plugin needs (the pods name it); None for Kueue (the admin's
    LocalQueue is all it needs)."""
    minimum = scheduling.min_available if scheduling.min_available is not None else members
    spec: dict = {"minMember": minimum}
    if scheduling.scheduler == "volcano":
        api = VOLCANO_PODGROUP_API
        if scheduling.queue:
            spec["queue"] = scheduling.queue
        if scheduling.priority_class:
            spec["priorityClassName"] = scheduling.priority_class
    elif scheduling.scheduler == "coscheduling":
        api = COSCHEDULING_PODGROUP_API
        if scheduling.schedule_timeout_seconds is not None:
            spec["scheduleTimeoutSeconds"] = scheduling.schedule_timeout_seconds
    else:
        return None
    if scheduling.min_resources:
        spec["minResources"] = dict(scheduling.min_resources)
    return {"apiVersion": api, "kind": "PodGroup", "metadata": _meta(name, namespace, {keys.JOB_NAME: name}),
            "spec": spec}


def check_scheduling(scheduling: Scheduling | None, members: int) -> None:
    if scheduling is None:
        return
    if scheduling.scheduler not in keys.GANG_SCHEDULERS:
        raise RenderError(f"--gang-scheduler {scheduling.scheduler}: use one of {', '.join(keys.GANG_SCHEDULERS)}")
    if scheduling.scheduler == "kueue" and not scheduling.queue:
        raise RenderError("--gang-scheduler kueue needs --queue: the LocalQueue the gang is admitted through")
    if scheduling.min_available is not None and not 1 <= scheduling.min_available <= members:
        raise RenderError(f"--min-available {scheduling.min_available}: give a pod count from 1 to the gang's "
                          f"{members}")
    if scheduling.schedule_timeout_seconds is not None and scheduling.scheduler != "coscheduling":
        raise RenderError("--schedule-timeout-seconds is a coscheduling PodGroup field")


def check_keys(gang: Gang) -> None:
    """A trainhook.dev/ key trainhook never reads (keys.unknown_keys) in a given pod template (the SDK's, convert's)
    or the gang's annotations is refused: the manifests would silently run without it."""
    problems = keys.unknown_keys({}, gang.annotations, "annotations")
    for role, _, template in gang.roles:
        meta = template.get("metadata") or {}
        problems += [f"role {role}: {p}" for p in keys.unknown_keys(meta.get("labels"), meta.get("annotations"),
                                                                     "template.metadata")]
    if problems:
        raise RenderError("; ".join(problems))


def gang_objects(gang: Gang) -> list[dict]:
    """The Service, one workload per role (rank order) and the PodGroup, if the scheduler needs one."""
    if gang.kind not in KINDS:
        raise RenderError(f"--kind {gang.kind}: use statefulset or job")
    if gang.framework not in keys.ROLES:
        raise RenderError(f"--framework {gang.framework}: use one of {', '.join(keys.ROLES)}")
    order = keys.ROLES[gang.framework]
    for role, count, _ in gang.roles:
        if role not in order:
            raise RenderError(f"role {role!r} is not a {gang.framework} role: use {', '.join(order)}")
        if count < 1:
            raise RenderError(f"role {role}={count}: give every role at least one replica (or leave it out)")
    if not gang.roles:
        raise RenderError("the gang has no replicas: give --workers N or --role ROLE=N")
    gang.roles.sort(key=lambda item: order.index(item[0]))
    check_keys(gang)
    check_scheduling(gang.scheduling, size(gang))
    objects = [service(gang.name, gang.namespace)]
    objects += [workload(gang, role, count, template) for role, count, template in gang.roles]
    group = pod_group(gang.scheduling, gang.name, gang.namespace, size(gang)) if gang.scheduling else None
    if group:
        objects.append(group)
    return objects


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (a shipped function, a shell script) as readable `|` blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(objects: list[dict]) -> str:
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, default_flow_style=False)
