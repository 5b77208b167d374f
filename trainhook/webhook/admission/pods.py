"""Pod mutation: find the pod's place in its gang and inject the environment, tolerations and the gang wait,
and, with the delivered launcher, the pod's identity for the notary (delivery.give_identity).

Everything the webhook needs is on the pod itself (labels and annotations stamped on the template, the name
or completion index the controllers set), so admission makes no API call.
"""

from __future__ import annotations

import re
from typing import Any

from trainhook.gang import keys
from trainhook.webhook.admission.delivery import (IDENTITY_MOUNT, deliver_launcher, delivered_by_configmap,
                                                 give_identity, identity_env)
from trainhook.gang.shape import elastic_shape
from trainhook.webhook.admission.frameworks import elastic_range, framework_env, framework_pod_hook
from trainhook.webhook.admission import provenance
from trainhook.webhook.admission.member import DNS_LABEL, Member, Problems, parse_shape
from trainhook.webhook.admission.jsondiff import json_copy
from trainhook.webhook.admission.lifecycle import check_lifecycle_options, lifecycle_env
from trainhook.webhook.admission.resources import wait_resources
from trainhook.webhook.admission.scheduling import set_gang_scheduling
from trainhook.webhook.settings import Settings, notary_ca_pem
from trainhook.webhook.admission.tolerations import chart_tolerations

ORDINAL = re.compile(r"^(.+)-(\d+)$")
GPU_TOLERATION = {"key": keys.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}


def controller_of(pod: dict) -> tuple[str, str]:
    """The (kind, name) of the pod's controlling owner, or ("", "") for a bare pod."""
    owner = provenance.controller_ref(pod)
    return (owner[0], owner[1]) if owner else ("", "")


def locate(pod: dict, problems: Problems) -> tuple[str, str, int | None]:
    """(owner kind, workload name, index) of a pod: StatefulSet ordinal, Job completion index or label."""
    meta = pod.get("metadata", {})
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    kind, owner = controller_of(pod)
    if kind in keys.UNSUPPORTED_KINDS:  # a Deployment's (through its ReplicaSet), a DaemonSet's: never a gang
        problems.add(f"ownerReferences[{kind}]", owner, f"the pod's controller is a {kind}, an unsupported kind: its "
                     f"pods have no stable index for a rank; the supported kinds are {keys.SUPPORTED_KINDS}",
                     keys.UNSUPPORTED_KIND_FIX)
        return kind, owner, None
    if kind == "StatefulSet":
        match = ORDINAL.match(meta.get("name") or "")
        if not match or match[1] != owner:
            problems.add("metadata.name", meta.get("name"), f"not a pod name of StatefulSet {owner}",
                         "let the StatefulSet controller name its pods <statefulset>-<ordinal>")
            return kind, owner, None
        return kind, owner, int(match[2])
    if kind == "Job" or keys.JOB_COMPLETION_INDEX in annotations:
        text = annotations.get(keys.JOB_COMPLETION_INDEX, "")
        if not text.isdigit():
            problems.add(keys.JOB_COMPLETION_INDEX, text or None, "a Job's pod has no completion index",
                         "set spec.completionMode: Indexed on the Job")
            return "Job", owner, None
        return "Job", owner or labels.get("job-name", ""), int(text)
    text = labels.get(keys.INDEX, "")
    if not text.isdigit():
        problems.add(keys.INDEX, text or None, "a bare Pod needs its index within its role",
                     f"set the label {keys.INDEX} to 0, 1, ...")
        return "", "", None
    return "", "", int(text)


def training_container(spec: dict, annotations: dict, problems: Problems) -> dict | None:
    """The container named by the `container` annotation, or the first one."""
    containers = spec.get("containers") or []
    wanted = annotations.get(keys.CONTAINER)
    if wanted is None:
        if not containers:
            problems.add("spec.containers", [], "the pod has no container", "add the training container")
            return None
        return containers[0]
    for container in containers:
        if container.get("name") == wanted:
            return container
    names = ", ".join(c.get("name", "?") for c in containers)
    problems.add(keys.CONTAINER, wanted, f"no container has that name (containers: {names})",
                 "name one of the pod's containers, or drop the annotation to use the first")
    return None


def gpu_count(container: dict) -> int:
    """The container's nvidia.com/gpu limit (or request); Kubernetes requires both to match for GPUs."""
    resources = container.get("resources") or {}
    for section in ("limits", "requests"):
        value = str((resources.get(section) or {}).get(keys.GPU_RESOURCE, "0"))
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 0


def port_option(framework: str, annotations: dict, problems: Problems) -> int:
    """The annotation's port, else the framework's default (0 for MPI, which has no master port)."""
    if keys.PORT not in annotations:
        return keys.DEFAULT_PORT[framework]
    text = annotations[keys.PORT]
    if not text.isdigit() or not 0 < int(text) < 65536:
        problems.add(keys.PORT, text, "not a TCP port", "use a number from 1 to 65535")
        return keys.DEFAULT_PORT[framework]
    return int(text)


def host_prefixes(shape_roles: tuple[str, ...], job_name: str, owner: str, role: str,
                  problems: Problems) -> dict[str, str]:
    """Hostname prefix per role: a single workload's pods are `<workload>-<i>`; multi-role and bare pods are
    `<job-name>-<role>-<i>`, Kubeflow's pod names."""
    if owner and len(shape_roles) == 1:
        return {role: owner}
    if owner and owner != f"{job_name}-{role}":
        problems.add("ownerReferences.name", owner, "a multi-role gang's workloads are named <job-name>-<role>",
                     f"name the workload {job_name}-{role}")
    return {r: f"{job_name}-{r}" for r in shape_roles}


def member_of(pod: dict, namespace: str, problems: Problems) -> Member | None:
    """Read the pod's gang membership; every problem found is added to `problems`."""
    meta, spec = pod.get("metadata", {}), pod.get("spec", {})
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    framework = labels.get(keys.FRAMEWORK, "")
    if framework not in keys.ROLES:
        problems.add(keys.FRAMEWORK, framework, "unknown framework", f"use one of {', '.join(keys.ROLES)}")
        return None
    kind, owner, index = locate(pod, problems)
    role = labels.get(keys.ROLE, keys.MAIN_ROLE[framework])
    if role not in keys.ROLES[framework]:
        problems.add(keys.ROLE, role, f"not a {framework} role", f"use one of {', '.join(keys.ROLES[framework])}")
    job_name = labels.get(keys.JOB_NAME) or owner
    if not job_name:
        problems.add(keys.JOB_NAME, None, "a bare Pod must name its gang", f"set the label {keys.JOB_NAME}")
    shape_text = annotations.get(keys.REPLICAS)
    if shape_text is None:
        fix = ("re-apply the workload so trainhook's webhook stamps it" if kind else
               f"set the annotation {keys.REPLICAS}, e.g. {role}=2")
        problems.add(keys.REPLICAS, None, "the pod does not say its gang's shape", fix)
    shape = parse_shape(shape_text, framework, problems) if shape_text is not None else None
    port = port_option(framework, annotations, problems)
    check_lifecycle_options(annotations, problems)
    if annotations.get(keys.GANG_WAIT, "dns") not in keys.GANG_WAIT_MODES:
        problems.add(keys.GANG_WAIT, annotations[keys.GANG_WAIT], "unknown gang-wait mode",
                     f"use one of {', '.join(keys.GANG_WAIT_MODES)}")
    if shape is None or index is None or not job_name or role not in keys.ROLES[framework]:
        return None
    elastic = elastic_range(framework, annotations.get(keys.ELASTIC), problems)
    if elastic is not None:  # any index below max: the gang may be scaled within min..max while it runs
        shape = elastic_shape(shape, role, elastic)
    if index >= shape.count(role) and elastic is not None:
        problems.add(keys.ELASTIC, annotations[keys.ELASTIC], f"index {index} of role {role} is beyond the elastic "
                     f"gang's maximum of {elastic[1]} members ({shape.count(role)} {role}s)",
                     f"scale the workload to at most {shape.count(role)}, or raise the maximum")
        return None
    if index >= shape.count(role):
        problems.add(keys.REPLICAS, str(shape), f"index {index} of role {role} is outside the gang",
                     f"make {role}={index + 1} or more, or scale the workload down")
        return None
    hosts = host_prefixes(shape.roles, job_name, owner, role, problems)
    subdomain = spec.get("subdomain") or job_name
    options = {k: v for k, v in annotations.items() if k in keys.USER_ANNOTATIONS}
    return Member(framework, job_name, namespace, role, index, shape, hosts, subdomain, port, options, elastic)


def elastic_gang_env(member: Member) -> list[tuple[str, str]]:
    """TRAINHOOK_ELASTIC=min:max for an elastic gang (PyTorch's): the gang wait (which has no PET_* variables) and
    the launcher wait for min members, not all max the shape allows."""
    elastic = member.elastic
    return [(keys.TH_ELASTIC, f"{elastic[0]}:{elastic[1]}")] if elastic else []


def gang_wait_mode(member: Member, delivered: bool) -> str:
    """The gang wait's mode: the pod's `gang-wait` annotation, else `none` where the launcher is delivered (its
    barrier holds every training until the whole gang has joined rank 0, in both delivery paths; a dns wait before
    it cost a 32-pod gang ~1 s more on the node, performance.md) and `dns` without it (the only wait then)."""
    return member.option(keys.GANG_WAIT, "none" if delivered else "dns")


def gang_env(member: Member, settings: Settings, wait: str) -> list[tuple[str, str]]:
    """TRAINHOOK_* variables: the gang's identity and peers, for the launcher and the gang wait (`wait`: its
    mode, gang_wait_mode)."""
    return [
        (keys.TH_FRAMEWORK, member.framework),
        (keys.TH_JOB_NAME, member.job_name),
        (keys.TH_NAMESPACE, member.namespace),
        (keys.TH_ROLE, member.role),
        (keys.TH_INDEX, str(member.index)),
        (keys.TH_RANK, str(member.rank)),
        (keys.TH_REPLICAS, str(member.shape)),
        (keys.TH_HOSTS, ",".join(f"{r}={p}" for r, p in member.hosts.items())),
        (keys.TH_SUBDOMAIN, member.subdomain),
        (keys.TH_ADDRESS, member.own_address),
        (keys.TH_PORT, str(member.port)),
        (keys.TH_GANG_WAIT, wait),
        (keys.TH_GANG_WAIT_PORT, str(keys.GANG_WAIT_PORT)),
        (keys.TH_WAIT_TIMEOUT, str(settings.wait_timeout)),
    ] + elastic_gang_env(member)


def set_env(container: dict, injected: list[tuple[str, str]], warnings: list[str]) -> None:
    """Put injected variables first (so `$(VAR)` in the user's env resolves) and never overwrite the user's."""
    own = container.get("env") or []
    if not own:  # the common case (the user set no variables): one list, no lookups
        container["env"] = [{"name": name, "value": value} for name, value in injected]
        return
    present = {item.get("name"): item for item in own}
    added = []
    for name, value in injected:
        mine = present.get(name)
        if mine is None:
            added.append({"name": name, "value": value})
        elif mine.get("value") != value:
            shown = mine.get("value") if "value" in mine else "(valueFrom)"
            warnings.append(f"container {container.get('name')}: kept your {name}={shown}; "
                            f"trainhook would set {value}")
    if added:
        container["env"] = added + own


def set_tolerations(spec: dict, gpus: int, namespace: str, settings: Settings) -> None:
    """The GPU toleration for a pod that requests GPUs (what Kubernetes' ExtendedResourceToleration gives it, in every
    namespace), and the chart's tolerations only where they apply (webhook/admission/tolerations.py: the namespaces
    named for them, the resource an entry requires): a label anyone can write must not open a tainted pool to
    everyone."""
    tolerations = spec.get("tolerations") or []
    chart = chart_tolerations(spec, namespace, settings.extra_tolerations, settings.toleration_namespaces)
    for toleration in ([GPU_TOLERATION] if gpus else []) + chart:
        if toleration not in tolerations:
            tolerations = tolerations + [json_copy(toleration)]  # a new list: the review's stays as it was
    if tolerations:
        spec["tolerations"] = tolerations


def restricted_context() -> dict:
    """Pod Security "restricted" for what we inject: non-root, no escalation, no capabilities, the runtime's
    seccomp profile; it writes only to the launcher volume, so its root filesystem can be read-only. (A literal
    per pod: it goes into every pod's patch, and building it is cheaper than copying a shared one.)"""
    return {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "runAsUser": 65532,
            "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"}}


def gang_wait_container(gang: list[tuple[str, str]], settings: Settings, deliver: bool, resources: dict,
                        identity: list[tuple[str, str]] | None = None) -> dict:
    """The init container that first delivers the launcher (when `deliver`), then, unless its mode (in `gang`, the
    member's TRAINHOOK_* variables) is none, holds the pod until every peer resolves (or accepts connections).
    One container does both: one image start per pod, not two. With `identity` (the notary's variables; tcp mode,
    where the pod has the identity volume) it also mounts the pod's token, so the tcp wait asks the notary for the
    gang's key and proves every hello with it (launcher/wait/tcp.py). `resources`: resources.py's wait_resources."""
    container: dict[str, Any] = {
        "name": keys.GANG_WAIT_CONTAINER,
        "image": settings.launcher_image,
        "command": [keys.LAUNCHER_PROGRAM, "wait"] + (["--install", keys.LAUNCHER_DIR] if deliver else []),
        "env": [{"name": n, "value": v} for n, v in gang],
        **({"resources": resources} if resources else {}),  # resources.py's wait_resources: the pod's QoS kept
        "securityContext": restricted_context(),
    }
    mounts: list[dict] = [{"name": keys.LAUNCHER_VOLUME, "mountPath": keys.LAUNCHER_DIR}] if deliver else []
    if identity:
        container["env"] += [{"name": n, "value": v} for n, v in identity]
        mounts.append(dict(IDENTITY_MOUNT))
    if mounts:
        container["volumeMounts"] = mounts
    return container


def set_gang_wait(spec: dict, member: Member, gang: list[tuple[str, str]], settings: Settings,
                  deliver: bool, identity: list[tuple[str, str]] | None = None) -> None:
    mode = gang_wait_mode(member, deliver)
    if mode == "none" and not deliver:
        return
    init = spec.get("initContainers") or []
    if not any(c.get("name") == keys.GANG_WAIT_CONTAINER for c in init):
        resources = wait_resources(spec, settings.wait_resources)
        spec["initContainers"] = [gang_wait_container(gang, settings, deliver, resources,
                                                      identity if mode == "tcp" else None)] + init


def set_address(pod: dict, member: Member, problems: Problems) -> None:
    """Give the pod the hostname and subdomain its peers will dial (bare and Job pods; StatefulSet pods have
    them from their controller)."""
    spec = pod["spec"]
    hostname = f"{member.hosts[member.role]}-{member.index}"
    if hostname != hostname.lower():  # the length is not what is wrong: say what is
        problems.add("spec.hostname", hostname, "the pod's address must be lower case (an RFC 1123 DNS label)",
                     f"write {keys.JOB_NAME} and the workload's name in lower case, e.g. {hostname.lower()!r}")
    elif len(hostname) > 63 or not DNS_LABEL.match(hostname):
        problems.add("spec.hostname", hostname, "the pod's address is not a DNS label of at most 63 characters",
                     f"shorten {keys.JOB_NAME} or the workload's name")
    current = spec.get("hostname")
    if current is not None and current != hostname:
        problems.add("spec.hostname", current, f"peers will dial this pod as {hostname}",
                     f"drop spec.hostname or set it to {hostname}")
    spec.setdefault("hostname", hostname)
    spec.setdefault("subdomain", member.subdomain)


def _shallow(value: Any) -> Any:
    """A new dict or list with the same items; anything else as it is (a malformed field stays malformed)."""
    kind = type(value)
    return dict(value) if kind is dict else list(value) if kind is list else value


def writable(pod: dict) -> dict:
    """A copy of the pod that the mutation may write to, sharing everything it does not write to.

    New: the pod, its spec, its containers' list and each container; shared: every other subtree of the
    review's object, which is thus never changed, and which the diff skips by identity (`jsondiff`). The rules
    that keep this true: the mutation writes keys only into these objects or into copies it makes itself (the
    gang schedulers' labels: `scheduling.writable_metadata`), and never changes a list in place (it builds a
    new one: env, tolerations, init containers, volumes, mounts). tests/webhook/test_pod_mutation_copies.py checks
    them for every mutation the webhook makes.
    """
    pod = dict(pod)
    if type(pod.get("spec")) is dict:
        spec = pod["spec"] = dict(pod["spec"])
        if type(spec.get("containers")) is list:
            spec["containers"] = [_shallow(container) for container in spec["containers"]]
    return pod


def mutate_pod(pod: dict, namespace: str, settings: Settings, warnings: list[str],
               user: str = "") -> tuple[dict, Problems]:
    """A copy of `pod` wired into its gang, and the problems that stop it (the copy is then discarded). `user`
    created it: a pod that names a StatefulSet or Job as its controller must be that controller's."""
    pod = writable(pod)
    problems = Problems()
    owner_ref = provenance.controller_ref(pod)
    provenance.check_creator(owner_ref, user, settings.controller_users, problems)
    annotations = pod.get("metadata", {}).get("annotations") or {}
    spec = pod.setdefault("spec", {})
    container = training_container(spec, annotations, problems)
    member = member_of(pod, namespace, problems)
    if member is None or container is None:
        return pod, problems
    gpus = gpu_count(container)
    workload = f"{owner_ref[0]}/{owner_ref[1]}" if owner_ref else f"Pod/{pod['metadata'].get('name', '')}"
    wired = framework_env(member, gpus, problems)
    set_address(pod, member, problems)
    framework_pod_hook(member, spec, container, problems)
    configmap = settings.launcher_configmap if namespace in settings.launcher_namespaces else None
    delivered = deliver_launcher(spec, container, member, annotations, problems, configmap)
    gang = gang_env(member, settings, gang_wait_mode(member, delivered))
    injected = wired + gang + lifecycle_env(member, workload, spec.get("restartPolicy", "Always"))
    identity: list[tuple[str, str]] = []
    if delivered and settings.notary_url and give_identity(spec, container, problems):
        # Only a delivered launcher talks to the notary (docs/operate/security.md); no key is ever in the spec.
        identity = identity_env(settings.notary_url, notary_ca_pem(settings))
        injected += identity
    set_env(container, injected, warnings)
    set_tolerations(spec, gpus, namespace, settings)
    if not (delivered and delivered_by_configmap(spec)):  # else the launcher's own barrier is the gang wait
        set_gang_wait(spec, member, gang, settings, delivered, identity)
    set_gang_scheduling(pod, member, problems, warnings)
    set_provenance(pod, namespace, settings.gang_key, owner_ref)
    return pod, problems


def set_provenance(pod: dict, namespace: str, key: bytes, owner_ref: tuple[str, str, str] | None) -> None:
    """Stamp which controller made the pod (provenance.py), replacing any stamp its creator wrote; none without a
    key (no notary) or a controller (a bare pod)."""
    meta = pod["metadata"] = dict(pod.get("metadata") or {})
    annotations = dict(meta.get("annotations") or {})
    stamped = provenance.stamp(key, namespace, pod, owner_ref)
    if stamped is None:
        annotations.pop(keys.PROVENANCE, None)
    else:
        annotations[keys.PROVENANCE] = stamped
    meta["annotations"] = annotations
