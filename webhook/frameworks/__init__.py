"""Per-framework environment builders: pure functions from a gang member to `(NAME, value)` pairs.

Each framework is a module of this package named after it (`pytorch.py`, `tensorflow.py`, ...) with
`build_env(member, gpus, problems) -> list[tuple[str, str]]`: the training container's GPU count, and a
`Problems` list for options it cannot use. It returns the variables in the order they should appear, before
the user's own. A framework without a module injects only the TRAINHOOK_* variables.
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import Callable

from trainhook import keys
from trainhook.webhook.gang import Member, Problems

EnvBuilder = Callable[[Member, int, Problems], list[tuple[str, str]]]


@cache
def builder_for(framework: str) -> EnvBuilder | None:
    if framework not in keys.ROLES:
        return None
    try:
        module = importlib.import_module(f"{__name__}.{framework}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{framework}":
            raise
        return None
    return module.build_env


def framework_env(member: Member, gpus: int, problems: Problems) -> list[tuple[str, str]]:
    builder = builder_for(member.framework)
    return builder(member, gpus, problems) if builder else []
