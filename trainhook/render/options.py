"""`trainhook render`'s flags (also `submit`'s and the SDK's) made into a gang: pod templates, the
trainhook.dev/ annotations the options ask for, each checked with a message naming the flag; the objects
themselves come from trainhook.render.objects, shared with `trainhook convert`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from trainhook.gang import keys
from trainhook.gang.shape import COUNT, SYNTAX, TWICE, ShapeError, parse_range, parse_shape
from trainhook.render.objects import ACTIVE_DEADLINE_SECONDS, ON_FAILURE, ON_FAILURE_POLICIES, Gang, RenderError, \
    Scheduling, gang_objects

# Kubernetes' resource.Quantity grammar.
QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[KMGTPE]i|[numkMGTPE])?$")
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
# A gang's name names its Service, which Kubernetes wants a DNS label starting with a letter (RFC 1035, the
# stricter form of RFC 1123's), and the pods' host names `<name>[-<role>]-<index>`, DNS labels of at most 63.
GANG_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS_LABEL_MAX = 63


@dataclass
class RenderOptions:
    """What `trainhook render` (and `submit`, and the SDK) take; roles as (role, count) in any order."""

    name: str
    framework: str = keys.PYTORCH
    roles: list[tuple[str, int]] = field(default_factory=list)
    image: str = ""
    command: list[str] = field(default_factory=list)
    gpus: int = 0
    cpu: str = ""
    memory: str = ""
    env: list[tuple[str, str]] = field(default_factory=list)
    elastic: str = ""
    on_failure: str = ""
    max_restarts: int | None = None
    active_deadline_seconds: int | None = None
    nproc_per_node: str = ""
    port: int | None = None
    namespace: str | None = None
    kind: str = "statefulset"
    scheduling: Scheduling | None = None
    container: str = ""  # the training container's name (default: the framework's, as Kubeflow names it)
    priority_class: str = ""  # without a gang scheduler (with one, Scheduling.priority_class)


def parse_roles(workers: int | None, role_args: list[str], framework: str) -> list[tuple[str, int]]:
    """`--workers N` and `--role ROLE=N` (repeatable) as (role, count) pairs. The `--role` flags are one shape
    (`role=count,...`, trainhook/gang/shape.py), so they obey the annotation's rules."""
    roles: dict[str, int] = {}
    if role_args:
        try:
            roles = dict(parse_shape(",".join(role_args)).counts)
        except ShapeError as e:
            if e.kind in (SYNTAX, COUNT):
                raise RenderError(f"--role {e.part}: write ROLE=COUNT, e.g. master=1") from e
            if e.kind == TWICE:
                raise RenderError(f"--role {e.part} given twice") from e
            raise RenderError(f"--role {' --role '.join(role_args)}: the roles add up to no pod") from e
    if workers is not None:
        if "worker" in roles:
            raise RenderError("--workers and --role worker=N both given: keep one")
        roles["worker"] = workers
    if framework == keys.MPI and roles and "launcher" not in roles:
        roles = {"launcher": 1, **roles}  # an MPI gang always has its launcher
    return list(roles.items())


def parse_env(pairs: list[str]) -> list[tuple[str, str]]:
    env = []
    for text in pairs:
        name, sep, value = text.partition("=")
        if not sep or not ENV_NAME.match(name):
            raise RenderError(f"--env {text}: write NAME=VALUE with a valid variable name")
        env.append((name, value))
    return env


def resources(options: RenderOptions) -> dict:
    """Per-pod resources: GPUs as a limit (requests follow), CPU as a request, memory as request and limit."""
    for flag, value in (("--cpu", options.cpu), ("--memory", options.memory)):
        if value and not QUANTITY.match(value):
            raise RenderError(f"{flag} {value}: not a Kubernetes quantity (e.g. 500m, 2, 4Gi)")
    if options.gpus < 0:
        raise RenderError(f"--gpus {options.gpus}: give a GPU count of 0 or more")
    requests: dict[str, object] = {}
    limits: dict[str, object] = {}
    if options.cpu:
        requests["cpu"] = options.cpu
    if options.memory:
        requests["memory"] = limits["memory"] = options.memory
    if options.gpus:
        limits[keys.GPU_RESOURCE] = options.gpus
    found = {}
    if requests:
        found["requests"] = requests
    if limits:
        found["limits"] = limits
    return found


MPI_LAUNCH = ["trainhook-launch", "mpirun", "--"]
MPI_WORKER = ["trainhook-launch", "mpi-worker"]


def mpi_launch(command: list[str]) -> list[str]:
    """An MPI launcher's command under `trainhook-launch mpirun --` (convert's MPIJob launchers; the webhook
    resolves `trainhook-launch` to the copy it delivers)."""
    return list(command) if command[:1] == ["trainhook-launch"] else MPI_LAUNCH + list(command)


def role_command(options: RenderOptions, role: str) -> list[str]:
    """The user's command as written: the webhook runs it under the launcher it delivers (`run --`; an MPI
    launcher's under `mpirun --`, docs/use/delivery.md). An MPI gang's workers have no command of their own: the
    webhook gives them `mpi-worker`, which keeps them up for mpirun's daemons."""
    if options.framework == keys.MPI and role == "worker":
        return []
    return list(options.command)


def pod_template(options: RenderOptions, role: str) -> dict:
    container: dict = {"name": options.container or options.framework, "image": options.image}
    command = role_command(options, role)
    if command:
        container["command"] = command
    if options.env:
        container["env"] = [{"name": name, "value": value} for name, value in options.env]
    found = resources(options)
    if found:
        container["resources"] = found
    return {"metadata": {}, "spec": {"containers": [container]}}


def option_annotations(options: RenderOptions, members: int) -> dict[str, str]:
    annotations: dict[str, str] = {}
    if options.elastic:
        if options.framework != keys.PYTORCH:
            raise RenderError("--elastic is PyTorch's (torchrun's c10d rendezvous)")
        try:
            low, high = parse_range(options.elastic)
        except ShapeError as e:
            raise RenderError(f"--elastic {options.elastic}: write MIN:MAX nodes with 1 <= MIN <= MAX, e.g. 2:4") from e
        if not low <= members <= high:
            raise RenderError(f"--elastic {options.elastic}: the gang's {members} pods must lie within it")
        annotations[keys.ELASTIC] = options.elastic
    if options.on_failure:
        if options.on_failure not in ON_FAILURE_POLICIES:
            raise RenderError(f"--on-failure {options.on_failure}: use {' or '.join(ON_FAILURE_POLICIES)}")
        annotations[ON_FAILURE] = options.on_failure
    for flag, number, key in (("--max-restarts", options.max_restarts, keys.MAX_RESTARTS),
                              ("--active-deadline-seconds", options.active_deadline_seconds, ACTIVE_DEADLINE_SECONDS)):
        if number is not None:
            if number < (1 if key == ACTIVE_DEADLINE_SECONDS else 0):
                raise RenderError(f"{flag} {number}: give a positive number")
            annotations[key] = str(number)
    nproc = options.nproc_per_node
    if nproc:
        if nproc not in keys.NPROC_WORDS and not (nproc.isdigit() and int(nproc) >= 1):
            raise RenderError(f"--nproc-per-node {nproc}: use auto, cpu, gpu or a positive integer")
        annotations[keys.NPROC_PER_NODE] = nproc
    if options.port is not None:
        if not 0 < options.port < 65536:
            raise RenderError(f"--port {options.port}: use a TCP port from 1 to 65535")
        annotations[keys.PORT] = str(options.port)
    if options.container:
        annotations[keys.CONTAINER] = options.container
    return annotations


def check_name(name: str, roles: list[tuple[str, int]]) -> None:
    """The gang's name as Kubernetes will take it, each rule said apart: the case and characters first (an upper-case
    name is not too long, and a message blaming the length sent users shortening it), then the length."""
    if not GANG_NAME.match(name or ""):
        suggestion = re.sub(r"^[^a-z]+|[^a-z0-9]+$", "", re.sub(r"[^a-z0-9-]+", "-", (name or "").lower()))
        example = f" (e.g. {suggestion})" if suggestion and GANG_NAME.match(suggestion) else " (e.g. mnist-ddp)"
        raise RenderError(f"NAME {name!r}: a gang's name must be lower case: letters a-z, digits and '-', starting "
                          f"with a letter and ending with a letter or digit{example}; it names the Service and the "
                          "pods' host names, which must be DNS labels (RFC 1123)")
    role_suffix = len(roles) > 1
    hosts = [f"{name}-{role}-{count - 1}" if role_suffix else f"{name}-{count - 1}" for role, count in roles]
    longest = max(hosts, key=len, default=name)
    if len(longest) > DNS_LABEL_MAX:
        room = len(name) - (len(longest) - DNS_LABEL_MAX)
        raise RenderError(f"NAME {name!r} is too long: its pod host name {longest} has {len(longest)} characters, and "
                          f"a DNS label at most {DNS_LABEL_MAX}; give a name of at most {room} characters")


def check_command(options: RenderOptions) -> None:
    if not options.command:
        raise RenderError("no training command: give it after `--` (trainhook render NAME ... -- python /train.py) or "
                          "as --command 'python /train.py'; without one the container runs its image's ENTRYPOINT, "
                          "which the webhook cannot read to run under its launcher, and refuses")


def check_restarts(options: RenderOptions) -> None:
    """`--max-restarts` counts the restarts of `--on-failure restart-gang` (or torchrun's own, `--elastic`); alone it
    would be written into the manifests and never used."""
    if options.max_restarts is not None and options.on_failure != keys.RESTART_GANG and not options.elastic:
        given = f" (given: --on-failure {options.on_failure})" if options.on_failure else ""
        raise RenderError(f"--max-restarts {options.max_restarts} counts the gang's restarts, which only "
                          f"--on-failure {keys.RESTART_GANG} makes{given} (or torchrun's, with --elastic): add "
                          f"--on-failure {keys.RESTART_GANG}, or drop --max-restarts")


def gang_of(options: RenderOptions) -> Gang:
    if not options.image:
        raise RenderError("--image is required: the training container's image")
    if not options.roles:
        raise RenderError("give the gang's size: --workers N, or --role ROLE=N for each role")
    check_name(options.name, options.roles)
    members = sum(count for _, count in options.roles)
    templates = [(role, count, pod_template(options, role)) for role, count in options.roles]
    return Gang(name=options.name, framework=options.framework, roles=templates, kind=options.kind,
                namespace=options.namespace, annotations=option_annotations(options, members),
                scheduling=options.scheduling, active_deadline_seconds=options.active_deadline_seconds,
                priority_class=options.priority_class)


def render(options: RenderOptions) -> list[dict]:
    """The manifests for `options`: Service, workloads, PodGroup (raises RenderError; each flag's own problem
    first, then what the flags together lack)."""
    objects = gang_objects(gang_of(options))
    check_restarts(options)
    check_command(options)
    return objects
