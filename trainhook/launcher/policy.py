"""The launcher's policy and settings, read from its environment, and each attempt's environment (contract
section 7; the user-facing account is docs/use/gang-lifecycle.md).

Why a module of its own: `read_settings` is the one place a launcher turns its TRAINHOOK_* variables (named in
trainhook/gang/keys.py) into the gang's policy (on failure, restarts, deadline, failure rules) and its own settings
(ports, graces, where it runs, whether it parks), refusing bad values by name; `attempt_env` is what the training
command is given per attempt. Everything here is pure. How the gang ended is outcome.py.

Plain classes, not dataclasses: every gang pod's launcher start reads its settings here, and importing the
dataclasses module (with its `inspect`) was several ms of that start's CPU (issue 32).
"""

from __future__ import annotations

import re

from trainhook.gang import keys
from trainhook.gang.failure_rules import FailureRules, RulesError
from trainhook.launcher.pod_view import ConfigError, GangView, parse_number

TYPE_CHECKING = False  # typing's own, without importing typing (trainhook/launcher/__init__.py says why)
if TYPE_CHECKING:
    from typing import Any, Mapping

ON_FAILURE, ACTIVE_DEADLINE_SECONDS = keys.ON_FAILURE, keys.ACTIVE_DEADLINE_SECONDS

# The variables a user may set (TH_STATE_DIR, TH_FINISH_GRACE, ...) and those given to the training command per
# attempt (TH_ATTEMPT, TH_RESTARTS) are named in trainhook/gang/keys.py with the rest.
# The identity token's file when TH_IDENTITY_TOKEN does not say: the projected volume the webhook injects.
IDENTITY_TOKEN_FILE = keys.IDENTITY_DIR + "/token"
# torch's opt-out of sharing the rendezvous' TCPStore across rounds: set for elastic gangs (attempt_env).
TORCH_DISABLE_SHARED_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"

FAIL_GANG, RESTART_GANG, ON_FAILURE_VALUES = keys.FAIL_GANG, keys.RESTART_GANG, keys.ON_FAILURE_VALUES
RESTART_POLICIES = ("Always", "OnFailure", "Never")
# Where rank 0's launcher listens for the gang (MPI control uses 29498, the gang wait 29499, torch 29500).
COORDINATOR_PORT = keys.COORDINATOR_PORT
DEFAULT_MAX_RESTARTS = 3
DEFAULT_FINISH_GRACE = 10.0
DEFAULT_STOP_GRACE = 5.0  # with the coordinator's reaction, members stop well within the contract's 10 s
DEFAULT_FAILURE_SETTLE = 3.0  # plus the stop grace, still within the contract's 10 s
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

PORT_SHIFT_WINDOW = 64  # attempts shift MASTER_PORT by (attempt - 1) mod this
NO_RULES = FailureRules()  # the default rules alone


class GangPolicy:
    """What the gang does about failures and time, read from the environment of rank 0 (the coordinator)."""

    __slots__ = ("on_failure", "max_restarts", "deadline", "join_timeout", "rules", "settle")

    def __init__(self, on_failure: str = FAIL_GANG, max_restarts: int = DEFAULT_MAX_RESTARTS,
                 deadline: float | None = None, join_timeout: float = 600.0, rules: FailureRules = NO_RULES,
                 settle: float = DEFAULT_FAILURE_SETTLE):
        self.on_failure, self.max_restarts = on_failure, max_restarts
        self.deadline = deadline  # active-deadline-seconds
        self.join_timeout = join_timeout  # how long members may take to join, or to come back for a restart
        self.rules = rules  # which failures restart-gang retries (trainhook.dev/failure-rules)
        self.settle = settle  # see keys.TH_FAILURE_SETTLE


class LaunchSettings:
    """Everything one launcher needs beyond its gang: the policy, ports, graces, and where it runs."""

    __slots__ = ("policy", "key", "port", "finish_grace", "stop_grace", "restart_policy", "workload_kind",
                 "workload_name", "state_dir", "local_status", "notary_url", "notary_ca", "identity_token")

    def __init__(self, policy: GangPolicy, key: bytes, port: int, finish_grace: float, stop_grace: float,
                 restart_policy: str, workload_kind: str, workload_name: str, state_dir: str, local_status: str,
                 notary_url: str = "", notary_ca: str = "", identity_token: str = IDENTITY_TOKEN_FILE):
        self.policy = policy
        # The gang's signing key (gang_protocol), from the notary (notary_client.py): never from the environment,
        # so read_settings leaves it empty and the launcher fills it in once the notary has answered (replace).
        self.key, self.port, self.finish_grace, self.stop_grace = key, port, finish_grace, stop_grace
        # Always: the container is restarted when the launcher exits, so it parks instead.
        self.restart_policy = restart_policy
        self.workload_kind = workload_kind  # StatefulSet, Job, Pod or "" (unknown)
        self.workload_name, self.state_dir, self.local_status = workload_name, state_dir, local_status
        # The notary the webhook named (TRAINHOOK_NOTARY, TRAINHOOK_NOTARY_CA; "" when none): where the key comes
        # from and where the coordinator records the outcome.
        self.notary_url, self.notary_ca, self.identity_token = notary_url, notary_ca, identity_token

    def replace(self, **changes: Any) -> LaunchSettings:
        """A copy with `changes` (keyword arguments of LaunchSettings), as dataclasses.replace made one."""
        return LaunchSettings(**{**{name: getattr(self, name) for name in LaunchSettings.__slots__}, **changes})

    @property
    def parks(self) -> bool:
        """Whether the launcher must stay up once the gang is done (its container would be rerun otherwise)."""
        return self.restart_policy == "Always"


def _number(env: Mapping[str, str], name: str, default: float, problems: list[str], integer: bool = False,
            low: float = 0.0, high: float = 1e9) -> float:
    """`parse_number` with the default kept when the value is malformed (the problem is still reported)."""
    value = parse_number(env, name, default, low, high, problems, integer)
    return default if value is None else float(value)


def workload_of(env: Mapping[str, str], gang: GangView) -> tuple[str, str]:
    """(kind, name) of this pod's workload: TRAINHOOK_WORKLOAD when the webhook injects it; otherwise an Indexed
    Job's pods are known by JOB_COMPLETION_INDEX (set by the Job controller), and anything else is taken for a
    StatefulSet, whose name is the role's hostname prefix (`<sts>-<ordinal>`)."""
    text = env.get(keys.TH_WORKLOAD, "").strip()
    prefix = gang.me.address.split(".", 1)[0].rsplit("-", 1)[0]
    if text:
        kind, _, name = text.partition("/")
        return kind, name
    if env.get("JOB_COMPLETION_INDEX", "").strip():
        return "Job", prefix
    return "StatefulSet", prefix


def read_settings(env: Mapping[str, str], gang: GangView) -> LaunchSettings:
    """The launcher's settings from the environment; ConfigError naming every bad variable."""
    problems: list[str] = []
    on_failure = env.get(keys.TH_ON_FAILURE, "").strip() or FAIL_GANG
    if on_failure not in ON_FAILURE_VALUES:
        problems.append(f"{keys.TH_ON_FAILURE}={on_failure!r}: use {' or '.join(ON_FAILURE_VALUES)} "
                        f"(the {ON_FAILURE} annotation)")
    max_restarts = int(_number(env, keys.TH_MAX_RESTARTS, DEFAULT_MAX_RESTARTS, problems, integer=True,
                               high=10000))
    deadline = _number(env, keys.TH_ACTIVE_DEADLINE, 0.0, problems, integer=True)
    port = int(_number(env, keys.TH_COORDINATOR_PORT, COORDINATOR_PORT, problems, integer=True, low=1,
                       high=65535))
    finish = _number(env, keys.TH_FINISH_GRACE, DEFAULT_FINISH_GRACE, problems)
    stop = _number(env, keys.TH_STOP_GRACE, DEFAULT_STOP_GRACE, problems)
    settle = _number(env, keys.TH_FAILURE_SETTLE, DEFAULT_FAILURE_SETTLE, problems, high=600)
    try:
        rules = FailureRules.from_text(env.get(keys.TH_FAILURE_RULES))
    except RulesError as e:
        rules = FailureRules()
        problems.append(f"{keys.TH_FAILURE_RULES}={env.get(keys.TH_FAILURE_RULES)!r}: {e} "
                        f"(the {keys.FAILURE_RULES} annotation: rules like {keys.RESTART_GANG}: SIGKILL, 1; "
                        f"{keys.FAIL_GANG}: 3)")
    kind, name = workload_of(env, gang)
    restart = env.get(keys.TH_RESTART_POLICY, "").strip() or ("Never" if kind == "Job" else "Always")
    if restart not in RESTART_POLICIES:
        problems.append(f"{keys.TH_RESTART_POLICY}={restart!r}: not a pod restartPolicy "
                        f"({', '.join(RESTART_POLICIES)})")
    if problems:
        raise ConfigError(problems)
    policy = GangPolicy(on_failure, max_restarts, deadline or None, gang.wait_timeout or 600.0, rules, settle)
    return LaunchSettings(policy=policy, key=b"", port=port,
                          finish_grace=finish, stop_grace=stop, restart_policy=restart, workload_kind=kind,
                          workload_name=name, state_dir=env.get(keys.TH_STATE_DIR, "").strip(),
                          local_status=env.get(keys.TH_LOCAL_STATUS, "").strip(),
                          notary_url=env.get(keys.TH_NOTARY, "").strip(), notary_ca=env.get(keys.TH_NOTARY_CA, ""),
                          identity_token=env.get(keys.TH_IDENTITY_TOKEN, "").strip() or IDENTITY_TOKEN_FILE)


def attempt_env(env: Mapping[str, str], attempt: int) -> dict[str, str]:
    """The training command's environment for `attempt` (1-based): a fresh rendezvous on every gang restart.

    Every member computes the same values from the attempt number, so they meet each other and nobody from an
    older attempt: torch's MASTER_PORT/PET_MASTER_PORT move by (attempt - 1), and an elastic gang's rendezvous
    id gets `-attempt-N` appended (torchrun reads both at start). Attempt 1 keeps Kubeflow's values unchanged.
    """
    out = dict(env)
    out[keys.TH_ATTEMPT] = str(attempt)
    out[keys.TH_RESTARTS] = str(attempt - 1)
    if out.get(keys.PET_RDZV_BACKEND, "").strip() and ":" in out.get(keys.PET_NNODES, ""):
        # torch >= 2.4 shares the rendezvous' TCPStore between rounds, and a node that joins a running elastic
        # gang then waits forever for store details its round's rank 0 never writes (seen with torch 2.13: the
        # first scale-up hangs every node in "Rendezvous'ing worker group"). A value the user set is kept.
        out.setdefault(TORCH_DISABLE_SHARED_STORE, "1")
    if attempt <= 1:
        return out
    shift = (attempt - 1) % PORT_SHIFT_WINDOW
    for name in (keys.MASTER_PORT, keys.PET_MASTER_PORT):
        value = out.get(name, "").strip()
        if value.isdigit() and 0 < int(value) + shift < 65536:
            out[name] = str(int(value) + shift)
    rdzv = out.get(keys.PET_RDZV_ID, "").strip()
    if rdzv:
        out[keys.PET_RDZV_ID] = re.sub(r"-attempt-\d+$", "", rdzv) + f"-attempt-{attempt}"
    return out
