"""Per-framework environment builders: pure functions from a gang member to `(NAME, value)` pairs.

Each framework is a module of this package named after it (`pytorch.py`, `tensorflow.py`, ...) with
`build_env(member, gpus, problems) -> list[tuple[str, str]]`: the training container's GPU count, and a
`Problems` list for options it cannot use. It returns the variables in the order they should appear, before
the user's own. A framework without a module injects only the TRAINHOOK_* variables. A module may also have
`check_shape(shape, problems)`: the workload's own admission calls it, so a shape the framework cannot run is
refused at `kubectl apply`, not later when the controller's pods are refused out of the user's sight. A module
whose gangs may change size while they run says `ELASTIC = True` (PyTorch's): only then is `trainhook.dev/elastic`
read (`is_elastic`, `elastic_range`), and no code outside this package names a framework to decide it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import cache

from trainhook.gang import keys
from trainhook.gang.shape import ShapeError, parse_range
from trainhook.webhook.admission.member import Member, Problems, Shape

EnvBuilder = Callable[[Member, int, Problems], list[tuple[str, str]]]


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
