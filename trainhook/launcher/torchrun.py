"""`trainhook-launch torchrun [TORCHRUN FLAGS] SCRIPT ARGS`: torchrun with its arguments from the environment.

torchrun already reads PET_* variables as defaults, but only when it is the process reading them, and a log
line of `torchrun train.py` says nothing about the gang it joined. Spelling the arguments out makes the
command in the pod's log the whole truth, fills them from the Kubeflow names (MASTER_ADDR, RANK) when PET_*
are absent, and lets a user override any of them by passing the flag: flags before SCRIPT win.

`torchrun_argv` is pure (environment and arguments in, argv out); `main` runs it through `run_command`, so
signals reach torchrun (which passes them to its workers) and its exit code is kept.
"""

from __future__ import annotations

import os
import re
import sys

from trainhook.gang import keys
from trainhook.launcher.pod_view import ConfigError
from trainhook.launcher.process import run_command

TYPE_CHECKING = False  # typing's own, without importing typing (trainhook/launcher/__init__.py says why)
if TYPE_CHECKING:
    from typing import Mapping, Sequence

TORCHRUN = (sys.executable, "-m", "torch.distributed.run")
# torchrun's options that take no value (checked against torch's own parser by the tests); every other option
# takes one, as `--opt value` or `--opt=value` (or `-rVALUE` for the short ones).
FLAG_OPTIONS = frozenset({"-h", "--help", "--standalone", "-m", "--module", "--no-python", "--run-path",
                          "--virtual-local-rank"})

NNODES = re.compile(r"^[1-9]\d*(:[1-9]\d*)?$")
NPROC = re.compile(r"^(auto|cpu|gpu|[1-9]\d*)$")
NUMBER = re.compile(r"^\d+$")
PORT = re.compile(r"^([1-9]\d{0,3}|[1-5]\d{4}|6[0-4]\d{3}|65[0-4]\d{2}|655[0-2]\d|6553[0-5])$")


def option_name(token: str) -> str:
    """The canonical spelling of an option token: `--nproc_per_node=2` -> `--nproc-per-node`."""
    if token.startswith("--"):
        return token.split("=", 1)[0].replace("_", "-")
    return token[:2]


def split_user_flags(args: Sequence[str]) -> tuple[list[str], list[str], list[str]]:
    """Split `[TORCHRUN FLAGS] [--] SCRIPT ARGS` into (flag tokens, canonical flag names, script and args)."""
    flags: list[str] = []
    names: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        if token == "--":
            return flags, names, list(args[i + 1:])
        if not token.startswith("-") or token == "-":
            break
        name = option_name(token)
        names.append(name)
        flags.append(token)
        inline = "=" in token if token.startswith("--") else len(token) > 2
        if name not in FLAG_OPTIONS and not inline and i + 1 < len(args):
            flags.append(args[i + 1])
            i += 1
        i += 1
    return flags, names, list(args[i:])


def env_options(env: Mapping[str, str], given: set[str]) -> list[str]:
    """torchrun's gang options from the environment, leaving out those the user passed; ConfigError if missing.

    Static gangs use the master address and a fixed node rank; elastic ones (PET_RDZV_BACKEND set) use the
    c10d rendezvous, which assigns ranks itself, so node rank and master address are left to it.
    """
    problems: list[str] = []
    unset: list[str] = []
    options: list[str] = []

    def add(flag: str, names: Sequence[str], pattern: re.Pattern[str] | None, required: bool = True) -> None:
        if flag in given:
            return
        for name in names:
            value = env.get(name, "").strip()
            if value:
                if pattern and not pattern.match(value):
                    problems.append(f"{name}={value!r}: not a valid value for torchrun's {flag}")
                options.extend([flag, value])
                return
        if required:
            unset.append(f"{' or '.join(names)} (for {flag})")

    standalone = "--standalone" in given
    if not standalone:
        add("--nnodes", [keys.PET_NNODES], NNODES)
    add("--nproc-per-node", [keys.PET_NPROC_PER_NODE], NPROC, required=False)
    if standalone:
        pass  # single node, local rendezvous: the gang's addresses do not apply
    elif env.get(keys.PET_RDZV_BACKEND, "").strip() or "--rdzv-backend" in given:
        add("--rdzv-backend", [keys.PET_RDZV_BACKEND], None)
        add("--rdzv-endpoint", [keys.PET_RDZV_ENDPOINT], None)
        add("--rdzv-id", [keys.PET_RDZV_ID], None)
        add("--max-restarts", [keys.PET_MAX_RESTARTS], NUMBER, required=False)
    else:
        add("--node-rank", [keys.PET_NODE_RANK, keys.RANK], NUMBER)
        add("--master-addr", [keys.PET_MASTER_ADDR, keys.MASTER_ADDR], None)
        add("--master-port", [keys.PET_MASTER_PORT, keys.MASTER_PORT], PORT)
    if unset:
        problems.insert(0, f"not set: {', '.join(unset)}; the trainhook webhook injects these into pods labeled "
                           f"{keys.FRAMEWORK}=pytorch, or pass the flags before the script")
    if problems:
        raise ConfigError(problems)
    return options


def torchrun_argv(env: Mapping[str, str], script_args: Sequence[str]) -> list[str]:
    """The full torchrun command: `python -m torch.distributed.run`, gang options, the user's flags, script.

    The user's flags go after ours as well as replacing them, so even a spelling we do not recognise (argparse
    accepts abbreviations like `--nproc`) still wins: torchrun's parser keeps the last value.
    """
    flags, names, script = split_user_flags(script_args)
    if not script:
        raise ConfigError("no training script given: trainhook-launch torchrun [TORCHRUN FLAGS] [--] SCRIPT [ARGS]")
    return [*TORCHRUN, *env_options(env, set(names)), *flags, *script]


def main(script_args: Sequence[str]) -> int:
    """The `torchrun` command: build the command from this pod's environment and run it."""
    argv = torchrun_argv(os.environ, script_args)
    print("trainhook-launch torchrun: " + " ".join(argv), file=sys.stderr, flush=True)
    return run_command(argv)
