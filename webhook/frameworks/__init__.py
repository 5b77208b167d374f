"""Per-framework environment builders: pure functions from a gang member to `(NAME, value)` pairs.

Each builder takes the member, the training container's GPU count and a `Problems` list (for options it
cannot use); it returns the variables in the order they should appear, before the user's own.
"""

from __future__ import annotations

from typing import Callable

from trainhook import keys
from trainhook.webhook.gang import Member, Problems
from trainhook.webhook.frameworks import pytorch

EnvBuilder = Callable[[Member, int, Problems], list[tuple[str, str]]]

BUILDERS: dict[str, EnvBuilder] = {
    keys.PYTORCH: pytorch.build_env,
}


def framework_env(member: Member, gpus: int, problems: Problems) -> list[tuple[str, str]]:
    """The framework's variables for `member`; a framework without a builder yet injects only TRAINHOOK_*."""
    builder = BUILDERS.get(member.framework)
    return builder(member, gpus, problems) if builder else []
