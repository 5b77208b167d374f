"""StatefulSet, Job and Service mutation: stamp the gang's shape on pod templates and make peers resolvable.

The webhook stamps on the template everything a pod will need at its own admission (framework, job name,
role, shape and the user's trainhook annotations), because pod admission may make no API call.
"""

from __future__ import annotations

import copy

from trainhook.gang import keys
from trainhook.gang.lookup import LABELS, lookup, template_metadata
from trainhook.webhook.admission.delivery import check_template
from trainhook.webhook.admission.frameworks import check_shape, elastic_range, is_elastic
from trainhook.webhook.admission.member import Problems, Shape, check_gang_size, parse_shape
from trainhook.webhook.admission.lifecycle import check_lifecycle_options
from trainhook.webhook.admission.resources import check_extended_resources
from trainhook.webhook.admission.scheduling import set_priority_class

# A real kube-apiserver fills these defaults before admission, so "unset" and "the default" look the same.
STS_DEFAULT_POLICY = "OrderedReady"
JOB_DEFAULT_MODE = "NonIndexed"


# The labels that place a workload in its gang (contract section 2).
IDENTITY_LABELS = (keys.FRAMEWORK, keys.JOB_NAME, keys.ROLE)


def template_labels(obj: dict) -> dict:
    """The labels on the workload's pod template ({} when it has none, or a malformed template)."""
    labels = template_metadata(obj).get("labels")
    return labels if isinstance(labels, dict) else {}


def refuse_conflict(obj: dict, found, problems: Problems) -> None:
    """A setting written on the workload and on its pod template with different values (trainhook/gang/lookup.py):
    a pod sees only its template's, `trainhook status` finds workloads by their own labels, and the webhook cannot
    tell which one the user meant."""
    if found.conflict:
        problems.add(found.key, found.workload, *found.refusal(obj.get("kind") or "workload"))


def identity_labels(obj: dict, problems: Problems) -> dict[str, str]:
    """The framework, job name and role labels the user wrote, on the workload's metadata or its pod template.

    Either place works, as for annotations: templates are what select pods, so many users label only those, and
    a multi-role gang read from the workload alone would take every member for a `worker` named after its own
    workload. Where both places say something, they must say the same (`refuse_conflict`).
    """
    found = {}
    for key in IDENTITY_LABELS:
        setting = lookup(obj, key, LABELS)
        refuse_conflict(obj, setting, problems)
        if setting.value is not None:
            found[key] = setting.value
    return found


def check_settings_agree(obj: dict, problems: Problems) -> None:
    """Every trainhook annotation written on both the workload and its pod template says the same there, as the
    identity labels must. Not trainhook.dev/replicas: on a template it is the webhook's own stamp of the shape
    (`workload_shape`, `check_template_shape`)."""
    for key in keys.USER_ANNOTATIONS:
        if key != keys.REPLICAS:
            refuse_conflict(obj, lookup(obj, key), problems)


def gang_identity(obj: dict, problems: Problems) -> tuple[str, str, str]:
    """(framework, job name, role) of a workload, from its metadata or its pod template, defaults applied."""
    labels = identity_labels(obj, problems)
    framework = labels.get(keys.FRAMEWORK, "")
    if framework not in keys.ROLES:
        problems.add(keys.FRAMEWORK, framework, "unknown framework", f"use one of {', '.join(keys.ROLES)}")
        return framework, "", ""
    role = labels.get(keys.ROLE, keys.MAIN_ROLE[framework])
    if role not in keys.ROLES[framework]:
        problems.add(keys.ROLE, role, f"not a {framework} role", f"use one of {', '.join(keys.ROLES[framework])}")
    job_name = labels.get(keys.JOB_NAME) or obj.get("metadata", {}).get("name", "")
    return framework, job_name, role


def elastic_option(obj: dict, framework: str, problems: Problems) -> tuple[int, int] | None:
    """An elastic framework's `trainhook.dev/elastic` (min, max), looked up as every setting is (the template's,
    then the workload's: trainhook/gang/lookup.py)."""
    if not is_elastic(framework):
        return None
    return elastic_range(framework, lookup(obj, keys.ELASTIC).value, problems)


def check_elastic_size(elastic: tuple[int, int], others: int, replicas: int, field: str,
                       problems: Problems) -> None:
    """An elastic gang's workload may be at any size whose gang stays within min..max (or 0: stopped)."""
    low, high = elastic
    if replicas and not low <= others + replicas <= high:
        problems.add(field, replicas, f"the elastic gang ({keys.ELASTIC}={low}:{high}) would have "
                     f"{others + replicas} members", f"set {field} within {max(low - others, 0)}..{high - others}, "
                     f"or change {keys.ELASTIC}")


def workload_shape(obj: dict, framework: str, role: str, replicas: int, field: str,
                   problems: Problems, elastic: tuple[int, int] | None = None) -> Shape | None:
    """The gang's shape: the user's annotation (required for multi-role gangs), else this workload alone.

    A single-role annotation on the template is ours from an earlier admission, so it is re-derived from the
    replica count (that is how a scaled StatefulSet gets its new shape); a multi-role one is the user's. An
    elastic gang's is its largest shape (max members) whatever the replica count: a change of spec.replicas
    within min..max (kubectl apply, an HPA) then leaves the template alone, and no running pod is rolled.
    """
    written = lookup(obj, keys.REPLICAS)
    text = written.workload
    if text is None and "," in (written.template or ""):
        text = written.template
    if text is None and elastic is not None:
        check_elastic_size(elastic, 0, replicas, field, problems)
        high = elastic[1]
        return Shape(((role, high),)) if check_gang_size(high, keys.ELASTIC, f"{elastic[0]}:{high}", problems) else None
    if text is None:
        return Shape(((role, replicas),)) if check_gang_size(replicas, field, replicas, problems) else None
    shape = parse_shape(text, framework, problems)
    if shape is not None and elastic is not None:
        check_elastic_size(elastic, shape.size - shape.count(role), replicas, field, problems)
    elif shape is not None and shape.count(role) != replicas:
        problems.add(keys.REPLICAS, text, f"says {role}={shape.count(role)} but {field} is {replicas}",
                     f"make them agree (update {keys.REPLICAS} together with {field})")
    if shape is not None:
        check_shape(framework, shape, problems)
    return shape


def check_template_shape(given: object, framework: str, shape: Shape, operation: str, replicas: int,
                         problems: Problems, warnings: list[str]) -> None:
    """The template's own `trainhook.dev/replicas`, where it is not the shape the webhook stamps: never rewritten
    in silence (issue 25). At CREATE no stamp of ours can be there yet (the pods see only the template's, and the
    user meant that size): refused, unless the workload is stopped (0 replicas: a finished gang's manifest read
    back). At UPDATE it is normally our stamp of the size before (`kubectl apply` of a new spec.replicas): re-stamped,
    with a warning that says so, since a user's edit of the template's annotation alone lands here too."""
    if given is None or given == str(shape) or parse_shape(str(given), framework, Problems()) == shape:
        return
    field = f"spec.template.metadata.annotations[{keys.REPLICAS}]"
    if operation == "CREATE" and replicas:
        problems.add(keys.REPLICAS, given, f"written on the pod template, it disagrees with the gang's shape "
                     f"{shape} (from the workload's size and annotations): the webhook stamps {keys.REPLICAS} on the "
                     "template itself", f"drop it from the template (set the size in the workload's "
                     f"spec.replicas/completions, a multi-role shape in the workload's own annotation), or make it "
                     f"{shape}")
        return
    warnings.append(f"{field}: {given!r} replaced by {str(shape)!r}: the gang's shape follows the workload's size "
                    f"and annotations, and its pods restart with the new one")


def stamp_template(obj: dict, framework: str, job_name: str, role: str, shape: Shape,
                   problems: Problems, warnings: list[str], operation: str = "CREATE", replicas: int = 0) -> None:
    """Labels and annotations every pod of the workload needs at its own admission.

    The identity labels go on the template, defaults included, since a pod sees nothing else; `gang_identity`
    has refused any disagreement with the template's own. They are not copied onto the workload: on the next
    admission a label the webhook stamped on the template looks like one the user wrote there, so copying
    back would stamp defaults on every workload, and pods never read the workload's labels.
    """
    meta = obj["spec"].setdefault("template", {}).setdefault("metadata", {})
    labels = meta.setdefault("labels", {})
    for key, value in ((keys.FRAMEWORK, framework), (keys.JOB_NAME, job_name), (keys.ROLE, role)):
        if not labels.get(key):  # an empty job name is unset: the pods take the workload's name, as it did
            labels[key] = value
    annotations = meta.setdefault("annotations", {})
    for key, value in (obj["metadata"].get("annotations") or {}).items():
        if key in keys.USER_ANNOTATIONS:
            annotations.setdefault(key, value)
    check_template_shape(annotations.get(keys.REPLICAS), framework, shape, operation, replicas, problems, warnings)
    annotations[keys.REPLICAS] = str(shape)
    check_lifecycle_options(annotations, problems)
    check_template(obj["spec"]["template"], framework, role, shape, problems)
    check_extended_resources(obj["spec"]["template"], problems)
    set_priority_class(obj["spec"]["template"].setdefault("spec", {}), annotations.get(keys.PRIORITY_CLASS, ""),
                       warnings)


def check_multi_role_names(name: str, job_name: str, role: str, shape: Shape, problems: Problems) -> None:
    if len(shape.roles) > 1 and name != f"{job_name}-{role}":
        problems.add("metadata.name", name, "a multi-role gang's workloads are named <job-name>-<role>",
                     f"name it {job_name}-{role}")


def mutate_statefulset(sts: dict, operation: str, warnings: list[str]) -> tuple[dict, Problems]:
    sts = copy.deepcopy(sts)
    problems = Problems()
    spec = sts.setdefault("spec", {})
    framework, job_name, role = gang_identity(sts, problems)
    check_settings_agree(sts, problems)
    if not spec.get("serviceName"):
        problems.add("spec.serviceName", spec.get("serviceName"), "peers resolve each other through it",
                     f"set it to the headless Service's name (e.g. {job_name or 'the job name'})")
    if problems:
        return sts, problems
    replicas = int(spec.get("replicas", 1))
    elastic = elastic_option(sts, framework, problems)
    shape = workload_shape(sts, framework, role, replicas, "spec.replicas", problems, elastic)
    if shape is None:
        return sts, problems
    check_multi_role_names(sts["metadata"].get("name", ""), job_name, role, shape, problems)
    if len(shape.roles) > 1 and spec["serviceName"] != job_name:
        problems.add("spec.serviceName", spec["serviceName"], "a multi-role gang shares one Service <job-name>",
                     f"set it to {job_name}")
    stamp_template(sts, framework, job_name, role, shape, problems, warnings, operation, replicas)
    if operation == "CREATE" and spec.get("podManagementPolicy", STS_DEFAULT_POLICY) == STS_DEFAULT_POLICY:
        if "podManagementPolicy" in spec:
            warnings.append("spec.podManagementPolicy: OrderedReady (the API server's default) set to Parallel: "
                            "under OrderedReady only pod 0 starts and the gang never forms")
        spec["podManagementPolicy"] = "Parallel"
    return sts, problems


def mutate_job(job: dict, operation: str, warnings: list[str]) -> tuple[dict, Problems]:
    job = copy.deepcopy(job)
    problems = Problems()
    if operation != "CREATE":  # a Job's template and completions are immutable once created
        return job, problems
    spec = job.setdefault("spec", {})
    framework, job_name, role = gang_identity(job, problems)
    check_settings_agree(job, problems)
    completions = spec.get("completions")
    if not isinstance(completions, int) or completions < 1:
        problems.add("spec.completions", completions, "an Indexed Job gang needs its size",
                     "set spec.completions to the number of pods")
        return job, problems
    if spec.get("parallelism", completions) != completions:
        problems.add("spec.parallelism", spec["parallelism"], f"only {spec['parallelism']} of {completions} "
                     "pods would run at once and the gang never forms", f"set spec.parallelism: {completions}")
    if spec.get("completionMode", JOB_DEFAULT_MODE) == JOB_DEFAULT_MODE:
        if "completionMode" in spec:
            warnings.append("spec.completionMode: NonIndexed (the API server's default) set to Indexed: "
                            "each pod needs its index to know its rank")
        spec["completionMode"] = "Indexed"
    spec.setdefault("parallelism", completions)
    if problems:
        return job, problems
    shape = workload_shape(job, framework, role, completions, "spec.completions", problems)
    if shape is None:
        return job, problems
    check_multi_role_names(job["metadata"].get("name", ""), job_name, role, shape, problems)
    stamp_template(job, framework, job_name, role, shape, problems, warnings, operation, completions)
    job["spec"]["template"].setdefault("spec", {}).setdefault("subdomain", job_name)
    return job, problems


def mutate_service(service: dict, operation: str, warnings: list[str]) -> tuple[dict, Problems]:
    """Headless, and publishing not-ready addresses: peers must resolve before any pod is Ready."""
    service = copy.deepcopy(service)
    problems = Problems()
    spec = service.setdefault("spec", {})
    if spec.get("type", "ClusterIP") != "ClusterIP":
        problems.add("spec.type", spec["type"], "pod hostnames resolve only through a headless Service",
                     "use a separate Service for outside access and make this one type ClusterIP")
    cluster_ip = spec.get("clusterIP")
    if cluster_ip not in (None, "", "None") or any(ip != "None" for ip in spec.get("clusterIPs") or []):
        fix = "delete and recreate the Service headless" if operation == "UPDATE" else "drop spec.clusterIP"
        problems.add("spec.clusterIP", cluster_ip, "pod hostnames resolve only through a headless Service", fix)
    if problems:
        return service, problems
    spec["clusterIP"] = "None"
    if spec.get("publishNotReadyAddresses") is False:
        warnings.append("spec.publishNotReadyAddresses: kept your false; peers will not resolve until Ready, "
                        "and a gang whose pods wait for each other may never start")
    spec.setdefault("publishNotReadyAddresses", True)
    return service, problems
