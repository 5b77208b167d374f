"""Per-framework environment builders: pure functions from a gang member to `(NAME, value)` pairs.

Each framework is a module of this package named after it (`pytorch.py`, `tensorflow.py`, ...) with
`build_env(member, gpus, problems) -> list[tuple[str, str]]`: the training container's GPU count, and a
`Problems` list for options it cannot use. It returns the variables in the order they should appear, before
the user's own. A framework without a module injects only the TRAINHOOK_* variables. A module may also have
`check_shape(shape, problems)`: the workload's own admission calls it, so a shape the framework cannot run is
refused at `kubectl apply`, not later when the controller's pods are refused out of the user's sight. A module
whose gangs may change size while they run says `ELASTIC = True` (PyTorch's): only then is `trainhook.dev/elastic`
read (`is_elastic`, `elastic_range`), and no code outside this package names a framework to decide it.

Three frameworks' variables list every member of the gang in every pod (TensorFlow's TF_CONFIG, MXNet's MX_CONFIG,
XGBoost/LightGBM's WORKER_ADDRS): O(N) per pod, O(N^2) per gang. Their gangs are refused above MAX_LISTED_MEMBERS
(`check_listed_size`, from each one's `check_shape`), and any such variable longer than the kernel takes
(`check_listed_length`). Why 1,000 (issue 32), in what the list costs at N members with the addresses trainhook
writes (`<job>-<role>-<i>.<job>:<port>`, about 50 bytes for a 10-character job name):
- the kernel refuses to start a process with one environment string over 128 KiB (MAX_ARG_STRLEN: execve fails
  with E2BIG, "argument list too long"), after the pod was admitted, scheduled and its image pulled, out of the
  user's sight. 1,000 members stay under it with names up to about 45 characters; the longest names (63-character
  host and subdomain labels) overflow it from about 960, which `check_listed_length` refuses, per pod, by length;
- the gang's pods carry N copies of the N-address list: 50 MB of pod specs in etcd at 1,000 members, 200 MB at
  2,000, and 5 GB at 10,000, more than etcd's default 2 GiB quota for the whole cluster;
- every pod's admission builds and diffs the list: 50 KB per pod at 1,000, which the webhook answers within its
  budget; 10,000 pods of 500 KB each would be 5 GB through the webhook and the API server for one gang.
A larger training needs a rendezvous that is O(1) per pod (PyTorch's MASTER_ADDR, RANK and WORLD_SIZE; JAX's and
Paddle's coordinator address), which is what trainhook's other frameworks get, up to MAX_GANG_SIZE.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import cache

from trainhook.gang import keys
from trainhook.gang.shape import ShapeError, parse_range
from trainhook.webhook.admission.member import Member, Problems, Shape

EnvBuilder = Callable[[Member, int, Problems], list[tuple[str, str]]]

MAX_LISTED_MEMBERS = 1000  # the most members a gang may have whose every pod lists every member (the docstring)
MAX_ARG_STRLEN = 128 * 1024  # Linux: the longest one "NAME=value" string (with its NUL) execve accepts


def check_listed_size(shape: Shape, variable: str, framework: str, problems: Problems) -> bool:
    """False (with the reason) when `shape` is too many members for `variable` to list in every pod."""
    if shape.size <= MAX_LISTED_MEMBERS:
        return True
    problems.add(keys.REPLICAS, str(shape), f"{variable} lists every member in every pod, so a gang of {shape.size} "
                 f"makes {shape.size} copies of a {shape.size}-address list (O(N^2): about "
                 f"{shape.size * shape.size * 50 // 1_000_000} MB of pod specs); trainhook refuses {variable} "
                 f"gangs above {MAX_LISTED_MEMBERS} members",
                 f"use at most {MAX_LISTED_MEMBERS} members in a {framework} gang; a larger training needs a "
                 f"rendezvous that is O(1) per pod, such as PyTorch's MASTER_ADDR, RANK and WORLD_SIZE")
    return False


def check_listed_length(name: str, value: str, problems: Problems) -> bool:
    """False (with the reason) when `name=value` is longer than the kernel lets a process start with."""
    length = len(name) + 1 + len(value.encode()) + 1
    if length <= MAX_ARG_STRLEN:
        return True
    problems.add(name, f"{len(value)} bytes", f"{name} lists every member, and with this gang's host names it is "
                 f"{length} bytes: Linux refuses to start a process with an environment string over "
                 f"{MAX_ARG_STRLEN} bytes (execve: E2BIG, argument list too long)",
                 f"shorten the job name or {keys.JOB_NAME} (every member's address repeats it), or use fewer "
                 f"members")
    return False


@cache
def module_for(framework: str):
    if framework not in keys.ROLES:
        return None
    try:
        return importlib.import_module(f"{__name__}.{framework}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{framework}":
            raise
        return None


def framework_env(member: Member, gpus: int, problems: Problems) -> list[tuple[str, str]]:
    module = module_for(member.framework)
    return module.build_env(member, gpus, problems) if module else []


def framework_pod_hook(member: Member, spec: dict, container: dict, problems: Problems) -> None:
    """A framework's own changes to the pod spec (`mutate_pod_spec`, e.g. MPI's /etc/mpi volume), if it has any."""
    module = module_for(member.framework)
    if module is not None and hasattr(module, "mutate_pod_spec"):
        module.mutate_pod_spec(member, spec, container, problems)


def launcher_words(framework: str, role: str, shape: Shape) -> list[str]:
    """The trainhook-launch subcommand that wraps a member's training: the framework's own (`launcher_words`,
    MPI's mpirun and mpi-worker), else `run`."""
    module = module_for(framework)
    if module is not None and hasattr(module, "launcher_words"):
        return module.launcher_words(role, shape)
    return ["run", "--"]


def check_shape(framework: str, shape: Shape, problems: Problems) -> None:
    module = module_for(framework)
    if module is not None and hasattr(module, "check_shape"):
        module.check_shape(shape, problems)


def is_elastic(framework: str) -> bool:
    """Whether `framework`'s gangs may change size while they run (its module's ELASTIC)."""
    return bool(getattr(module_for(framework), "ELASTIC", False))


def elastic_range(framework: str, text: str | None, problems: Problems | None = None) -> tuple[int, int] | None:
    """(min, max) of a `trainhook.dev/elastic` value of an elastic framework's workload or pod: the one parse of
    it in admission (a pod's is kept on its Member). None for any other framework, without the annotation, or when
    it is not a range, which is then named in `problems`."""
    text = (text or "").strip()
    if not text or not is_elastic(framework):
        return None
    try:
        return parse_range(text)
    except ShapeError:
        if problems is not None:
            problems.add(keys.ELASTIC, text, "not an elastic range", "write min:max with 1 <= min <= max, e.g. 2:4")
        return None
