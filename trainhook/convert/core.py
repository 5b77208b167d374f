"""`trainhook convert`: Kubeflow training jobs into trainhook manifests, as pure functions.

PyTorchJob, TFJob, XGBoostJob, JAXJob, PaddleJob and MPIJob (kubeflow.org/v1, and mpi-operator's
kubeflow.org/v2beta1 MPIJob) become a headless Service and one workload per replica type, named
`<job>-<role>` so the pods keep Kubeflow's names (`<job>-worker-0`). Pod templates are kept whole (containers,
tolerations, volumes, resources, env); every Kubeflow field with a trainhook counterpart is mapped to it
(docs/use/convert.md has the table), and every other one is named in a warning, never dropped silently.
"""

from __future__ import annotations

import copy

from trainhook.gang import keys
from trainhook.convert.policies import KUBECTL_LAST_APPLIED, KUEUE_QUEUE_LABEL, MPI_IMPLEMENTATION, \
    SERVER_METADATA, SLOTS_PER_WORKER, ConvertError, Converted, Fields, KubeflowKind, as_int, infer_scheduler, \
    kubeflow_port, mpi_options, pytorch_options, scheduling_of, set_mpi_commands, training_container
from trainhook.convert.run_policy import Restart, clean_pod_policy, pod_restart_policy, run_policy
from trainhook.render.objects import Gang, RenderError, gang_objects
from trainhook.webhook.admission.delivery import parse_entrypoint
from trainhook.webhook.admission.member import Problems
from trainhook.yaml_stream import yaml_documents

__all__ = ["KINDS", "ConvertError", "Converted", "MPI_IMPLEMENTATION", "SLOTS_PER_WORKER", "convert_job",
           "load_documents"]

RESTART_POLICIES = ("Always", "OnFailure", "Never", "ExitCode")  # Kubeflow's

KINDS: dict[tuple[str, str], KubeflowKind] = {
    ("kubeflow.org/v1", "PyTorchJob"): KubeflowKind(keys.PYTORCH, "pytorchReplicaSpecs", "pytorch", "pytorchjob-port",
                                                    restart_policy="OnFailure", single_type="Master",
                                                    kubeflow_refuses=True),
    ("kubeflow.org/v1", "TFJob"): KubeflowKind(keys.TENSORFLOW, "tfReplicaSpecs", "tensorflow", "tfjob-port"),
    ("kubeflow.org/v1", "XGBoostJob"): KubeflowKind(keys.XGBOOST, "xgbReplicaSpecs", "xgboost", "xgboostjob-port",
                                                    single_type="Master", kubeflow_refuses=True),
    ("kubeflow.org/v1", "JAXJob"): KubeflowKind(keys.JAX, "jaxReplicaSpecs", "jax", "jaxjob-port"),
    ("kubeflow.org/v1", "PaddleJob"): KubeflowKind(keys.PADDLE, "paddleReplicaSpecs", "paddle", "master",
                                                   restart_policy="OnFailure", single_type="Master"),
    ("kubeflow.org/v1", "MPIJob"): KubeflowKind(keys.MPI, "mpiReplicaSpecs", "mpi", "", single_type="Launcher",
                                                kubeflow_refuses=True),
    ("kubeflow.org/v2beta1", "MPIJob"): KubeflowKind(keys.MPI, "mpiReplicaSpecs", "", "",
                                                     launcher_restart_policy="OnFailure", single_type="Launcher",
                                                     kubeflow_refuses=True),
}


def role_template(kubeflow_spec: dict, role: str, kind: KubeflowKind, main_container: str, workload_kind: str,
                  fields: Fields) -> tuple[dict, Restart, int | None]:
    """(pod template, the Kubeflow restartPolicy, the Kubeflow port) of one replica type.

    The restartPolicy is the replica type's, else Kubeflow's default for the kind: Kubeflow overwrites the
    template's own with it, so a different one in the template is warned about and has no effect here either."""
    path = f"spec.{kind.replica_specs}.{role}"
    replica = dict(kubeflow_spec)
    template = copy.deepcopy(replica.pop("template", None) or {})
    restart = Restart(replica.pop("restartPolicy", ""))
    if not restart.policy:
        restart = Restart(kind.default_restart_policy(role.lower()), defaulted=True)
    elif restart.policy not in RESTART_POLICIES:
        raise ConvertError(f"{fields.where}: {path}.restartPolicy={restart.policy}: use {', '.join(RESTART_POLICIES)}")
    replica.pop("replicas", None)
    fields.leftovers(path, replica)
    spec = template.setdefault("spec", {})
    if not spec.get("containers"):
        raise ConvertError(f"{fields.where}: {path}.template.spec.containers is empty")
    own = spec.pop("restartPolicy", None)
    if own is not None and own != pod_restart_policy(restart.policy):
        fields.drop(f"{path}.template.spec.restartPolicy", own,
                    f"Kubeflow replaces it with the replica type's restartPolicy ({restart.policy}"
                    f"{', its default' if restart.defaulted else ''}); set that one")
    if workload_kind == "job" and restart.policy in ("Never", "OnFailure"):
        spec["restartPolicy"] = restart.policy
    container = training_container(template, kind, main_container)
    if container is None:
        names = ", ".join(c.get("name", "?") for c in spec["containers"])
        fields.warnings.append(f"{fields.where}: {path}: no container named {main_container or kind.container} "
                               f"(containers: {names}); trainhook injects into the first one")
    return template, restart, kubeflow_port(container, kind.port_name)


def check_single(kind: KubeflowKind, kind_name: str, replica_type: str, replicas: int, specs: dict,
                 where: str) -> None:
    """A Master (PyTorchJob, XGBoostJob, PaddleJob) or Launcher (MPIJob) with replicas other than 1 is refused: the
    converted gang would be refused by trainhook's webhook at `kubectl apply` (and by `trainhook explain`), and
    Kubeflow refuses the job itself for PyTorchJob, XGBoostJob and MPIJob, so the manifests could never have run.
    Zero is refused where Kubeflow refuses it (its check is `!= 1`); PaddleJob's zero is left to the zero-replica
    warning, as Kubeflow takes it."""
    if not kind.single_type or replica_type.lower() != kind.single_type.lower():
        return
    if replicas == 1 or (replicas < 1 and not kind.kubeflow_refuses):
        return
    single = kind.single_type
    worker = next((t for t in specs if t.lower() == "worker"), "Worker")
    workers = as_int((specs.get(worker) or {}).get("replicas", 1), f"spec.{kind.replica_specs}.{worker}.replicas") \
        if worker in specs else 0
    who = (f"Kubeflow allows exactly one {single} per {kind_name} (it refuses this job: there must be only 1 "
           f"{single.lower()} replica), and trainhook's webhook would refuse the converted gang"
           if kind.kubeflow_refuses else f"trainhook's webhook runs exactly one {single.lower()} and would refuse "
                                         "the converted gang")
    fix = (f"set {single}.replicas: 1 and put the other replicas in {worker} ({worker}.replicas: "
           f"{workers + replicas - 1})" if replicas > 1 else f"set {single}.replicas: 1")
    raise ConvertError(f"{where}: spec.{kind.replica_specs}.{replica_type}.replicas={replicas}: {who}; {fix}")


def check_keys(where: str, labels: dict, annotations: dict, templates: list[tuple[str, int, dict]],
               types: dict[str, str], replica_specs: str) -> None:
    """A trainhook.dev/ key of the job or a pod template that trainhook would never read (a typo): refused, as
    by every CLI tool (keys.unknown_keys): the converted gang would silently run without it."""
    problems = keys.unknown_keys(labels, annotations)
    for role, _, template in templates:
        meta = template.get("metadata") or {}
        problems += keys.unknown_keys(meta.get("labels"), meta.get("annotations"),
                                      f"spec.{replica_specs}.{types[role]}.template.metadata")
    if problems:
        raise ConvertError(f"{where}: " + "; ".join(problems))


def check_entrypoint_annotation(value: str, where: str) -> None:
    """A `trainhook.dev/entrypoint` annotation checked as the webhook checks it (a JSON list of strings)."""
    problems = Problems()
    if parse_entrypoint(value, problems) is None:
        raise ConvertError(f"{where}: " + "; ".join(problems))


def parse_entrypoint_option(text: str) -> list[str]:
    """`--entrypoint`'s value, refused as the webhook refuses the annotation (a JSON list of strings)."""
    problems = Problems()
    value = parse_entrypoint(text, problems)
    if value is None:
        raise ConvertError("--entrypoint " + "; ".join(problems).replace(f"{keys.ENTRYPOINT}=", "", 1))
    return value


def require_commands(templates: list[tuple[str, int, dict]], types: dict[str, str], kind: KubeflowKind,
                     main_container: str, job_annotations: dict, entrypoint: list[str] | None, where: str) -> None:
    """A training container without `command` runs its image's ENTRYPOINT, which the webhook cannot read to wrap
    it in trainhook-launch (docs/use/delivery.md): it would refuse the pods. So convert refuses too, naming the fixes,
    unless `--entrypoint` gives the image's entrypoint (written as the container's command) or the job or
    template annotates it (`trainhook.dev/entrypoint`, checked here as the webhook checks it). An MPI launcher's
    workers need none (they run `trainhook-launch mpi-worker`)."""
    missing = []
    for role, _, template in templates:
        given = {**job_annotations, **((template.get("metadata") or {}).get("annotations") or {})}
        if keys.ENTRYPOINT in given:
            check_entrypoint_annotation(given[keys.ENTRYPOINT], where)
        if keys.ENTRYPOINT in given or given.get(keys.LAUNCHER) == keys.LAUNCHER_NONE:
            continue
        if kind.framework == keys.MPI and role == "worker":
            continue
        container = training_container(template, kind, main_container) or template["spec"]["containers"][0]
        if container.get("command"):
            continue
        if entrypoint is not None:
            container["command"] = list(entrypoint)
            continue
        missing.append(f"spec.{kind.replica_specs}.{types[role]}: container {container.get('name')}")
    if missing:
        raise ConvertError(
            f"{where}: {' and '.join(missing)} {'has' if len(missing) == 1 else 'have'} no command: it would run "
            f"its image's ENTRYPOINT, which trainhook's "
            f"webhook cannot read (that needs a registry call) to run it under trainhook-launch, so it would refuse "
            f"the pods; give the image's entrypoint with --entrypoint '[\"python\", \"/app/train.py\"]' (written "
            f"as the container's command), or write `command` in the job, or annotate the job "
            f"{keys.ENTRYPOINT}: '[\"python\", \"/app/train.py\"]'")


def convert_job(job: dict, workload_kind: str = "statefulset", gang_scheduler: str | None = None,
                namespace: str | None = None, entrypoint: list[str] | None = None) -> Converted:
    """One Kubeflow job as trainhook objects (Service, workloads, PodGroup) and the warnings for what is left.
    `entrypoint`: the image's ENTRYPOINT, the command of training containers that have none."""
    api_version, kind_name = job.get("apiVersion", ""), job.get("kind", "")
    kind = KINDS.get((api_version, kind_name))
    meta = copy.deepcopy(job.get("metadata") or {})
    name = meta.pop("name", "")
    where = f"{kind_name}/{name or '?'}"
    if kind is None:
        supported = ", ".join(f"{k} ({v})" for v, k in KINDS)
        raise ConvertError(f"{where}: {api_version} {kind_name} is not a Kubeflow job convert knows; it converts "
                           f"{supported}")
    if not name:
        raise ConvertError(f"{kind_name}: metadata.name is required")
    result = Converted()
    fields = Fields(where, result.warnings)
    spec = copy.deepcopy(job.get("spec") or {})
    specs = spec.pop(kind.replica_specs, None)
    if not isinstance(specs, dict) or not specs:
        raise ConvertError(f"{where}: spec.{kind.replica_specs} is required (the replica types)")
    labels = dict(meta.pop("labels", None) or {})
    annotations_in = dict(meta.pop("annotations", None) or {})
    annotations_in.pop(KUBECTL_LAST_APPLIED, None)
    own_namespace = meta.pop("namespace", None)
    for server_field in SERVER_METADATA:
        meta.pop(server_field, None)
    fields.leftovers("metadata", meta)

    annotations: dict[str, str] = {}
    roles_in = {}
    order = keys.ROLES[kind.framework]
    for replica_type, replica in specs.items():
        role = replica_type.lower()
        if role not in order:
            raise ConvertError(f"{where}: spec.{kind.replica_specs}.{replica_type}: not a {kind_name} replica type "
                               f"(use {', '.join(r.capitalize() if r != 'ps' else 'PS' for r in order)})")
        replicas = as_int((replica or {}).get("replicas", 1), f"spec.{kind.replica_specs}.{replica_type}.replicas")
        check_single(kind, kind_name, replica_type, replicas, specs, where)
        if replicas < 1:
            fields.drop(f"spec.{kind.replica_specs}.{replica_type}", replica, "zero replicas")
            continue
        roles_in[role] = (replica_type, replicas, replica or {})
    main_container = ""
    if kind.framework == keys.PYTORCH:
        pytorch_options(spec, roles_in.get("worker", ("", 0, {}))[1], fields, annotations)
    elif kind.framework == keys.MPI:
        main_container = mpi_options(spec, api_version, fields, annotations)
    elif kind.framework == keys.PADDLE and "elasticPolicy" in spec:
        fields.drop("spec.elasticPolicy", spec.pop("elasticPolicy"), "trainhook's elastic training is PyTorch's")
    if kind.framework == keys.TENSORFLOW:
        for name_, default, why in (
                ("successPolicy", "", "the gang succeeds when rank 0 (the chief, else worker 0) does, as with "
                                      "Kubeflow's default policy; make rank 0 wait for the workers to end with all"),
                ("enableDynamicWorker", False, "TF_CONFIG lists the gang as created; workers are not added or "
                                               "removed while it runs")):
            if spec.get(name_, default) != default:
                fields.drop(f"spec.{name_}", spec.pop(name_), why)
            spec.pop(name_, None)
    if kind.framework == keys.MPI and api_version == "kubeflow.org/v1" and "cleanPodPolicy" in spec:
        clean_pod_policy("spec.cleanPodPolicy", spec.pop("cleanPodPolicy"), workload_kind, fields)

    templates, restarts, ports = [], {}, {}
    for role in sorted(roles_in, key=order.index):
        replica_type, replicas, replica = roles_in[role]
        template, restart, port = role_template(replica, replica_type, kind, main_container, workload_kind, fields)
        templates.append((role, replicas, template))
        restarts[replica_type] = restart
        if port is not None:
            ports[role] = port
    types = {r: t for r, (t, _, _) in roles_in.items()}
    check_keys(where, labels, annotations_in, templates, types, kind.replica_specs)
    require_commands(templates, types, kind, main_container, annotations_in, entrypoint, where)
    if kind.framework == keys.MPI:
        set_mpi_commands(templates, kind, main_container, fields)
    container_name = main_container or kind.container
    having = [t for _, _, t in templates if training_container(t, kind, main_container)]
    if container_name and len(having) == len(templates):
        annotations[keys.CONTAINER] = container_name
    elif container_name:  # only the roles that have it name it; the others train in their first container
        for template in having:
            template.setdefault("metadata", {}).setdefault("annotations", {})[keys.CONTAINER] = container_name
    if ports:
        first = ports[next(r for r, _, _ in templates if r in ports)]
        if len(set(ports.values())) > 1:
            result.warnings.append(f"{where}: the replica types name different {kind.port_name} ports "
                                   f"({ports}); trainhook uses one for the gang: {first}")
        annotations[keys.PORT] = str(first)

    pod_templates = [t for _, _, t in templates]
    scheduler = gang_scheduler or infer_scheduler(pod_templates, labels)
    policy = dict(spec.pop("runPolicy", None) or {})
    scheduling_policy = policy.pop("schedulingPolicy", None) or {}
    lifecycle = run_policy(policy, restarts, f"spec.{kind.replica_specs}", api_version == "kubeflow.org/v2beta1",
                           workload_kind, scheduler, fields, annotations)
    fields.leftovers("spec", spec)
    scheduler_names = {(t.get("spec") or {}).get("schedulerName") for t in pod_templates}
    scheduling, priority = scheduling_of(scheduling_policy, scheduler, labels, fields, scheduler_names)
    if scheduler == "kueue":
        labels.pop(KUEUE_QUEUE_LABEL, None)  # the pods carry it (the webhook), not the workloads
    gang = Gang(name=name, framework=kind.framework, roles=templates, kind=workload_kind,
                namespace=own_namespace or namespace, annotations=annotations, scheduling=scheduling,
                role_suffix=True, active_deadline_seconds=lifecycle.active_deadline_seconds, priority_class=priority)
    try:
        result.objects = gang_objects(gang)
    except RenderError as e:
        raise ConvertError(f"{where}: {e}") from e
    for obj in result.objects:
        if obj["kind"] == "Job":
            obj["spec"].update(lifecycle.job_spec)
        if obj["kind"] in ("StatefulSet", "Job"):
            obj["metadata"]["labels"] = {**labels, **obj["metadata"]["labels"]}
            if annotations_in:
                obj["metadata"]["annotations"] = {**annotations_in, **obj["metadata"].get("annotations", {})}
    return result


def load_documents(text: str, path: str = "<input>") -> list[dict]:
    """The objects of a YAML stream (`kind: List` expanded); invalid YAML is reported with its line and column."""
    objects = []
    for number, doc in enumerate(yaml_documents(text, path, ConvertError), start=1):
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise ConvertError(f"{path}: document {number} is a {type(doc).__name__}, not a Kubernetes object")
        if doc.get("kind") == "List":
            objects += [item for item in doc.get("items") or [] if isinstance(item, dict)]
        else:
            objects.append(doc)
    return objects
