"""The gang's lifecycle as data: the keys, the policy read from the environment, outcomes, and each attempt's
environment (contract section 7; the user-facing account is docs/use/gang-lifecycle.md).

Everything here is pure. The keys the webhook injects or copies live in trainhook/keys.py; the variables below
are the launcher's own.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import asdict, dataclass
from typing import Mapping

from trainhook import keys
from trainhook.launcher.failure_rules import FailureRules, RulesError
from trainhook.launcher.gang import ConfigError, Gang, parse_number

ON_FAILURE, ACTIVE_DEADLINE_SECONDS = keys.ON_FAILURE, keys.ACTIVE_DEADLINE_SECONDS
PHASE, PHASE_TIME, PHASE_REASON, EXIT_CODE = keys.PHASE, keys.PHASE_TIME, keys.PHASE_REASON, keys.EXIT_CODE
TH_ON_FAILURE, TH_MAX_RESTARTS, TH_ACTIVE_DEADLINE = keys.TH_ON_FAILURE, keys.TH_MAX_RESTARTS, keys.TH_ACTIVE_DEADLINE
TH_FAILURE_RULES = keys.TH_FAILURE_RULES
TH_WORKLOAD, TH_RESTART_POLICY, TH_COORDINATOR_PORT = keys.TH_WORKLOAD, keys.TH_RESTART_POLICY, keys.TH_COORDINATOR_PORT

# --- Variables a user may set (not injected) ------------------------------------------------------------------
TH_STATE_DIR = "TRAINHOOK_STATE_DIR"  # a directory that outlives the container (an emptyDir): the outcome marker
TH_FINISH_GRACE = "TRAINHOOK_FINISH_GRACE"  # seconds members still running get after rank 0 succeeded
TH_STOP_GRACE = "TRAINHOOK_STOP_GRACE"  # seconds between SIGTERM and SIGKILL when a member's training is stopped
TH_SERVICE_ACCOUNT_DIR = "TRAINHOOK_SERVICE_ACCOUNT_DIR"  # the pod's API token, for the MPI kubexec transport only
# Where the pod's identity token for the notary is (default: the file of the projected volume the webhook
# injects, keys.IDENTITY_DIR/token), for tests and images that mount it elsewhere.
TH_IDENTITY_TOKEN = "TRAINHOOK_IDENTITY_TOKEN"
IDENTITY_TOKEN_FILE = keys.IDENTITY_DIR + "/token"
# Set by `trainhook local` on the training container: the file the launcher keeps its state in, for the runner.
TH_LOCAL_STATUS = "TRAINHOOK_LOCAL_STATUS"
# Seconds the coordinator waits, when a member's failure is fatal only by the default rule (exit 1-127), for a
# failure that shows what caused it: a member whose peer was killed often exits 1 before the killed one's exit
# (137) arrives, and the killed one's is the gang's real failure (coordinator.GangState._failure).
TH_FAILURE_SETTLE = "TRAINHOOK_FAILURE_SETTLE"

# --- Given to the training command, per attempt -----------------------------------------------------------------
TH_ATTEMPT = "TRAINHOOK_ATTEMPT"  # 1, 2, ...: the gang's attempt this process belongs to (run.TH_ATTEMPT)
TH_RESTARTS = "TRAINHOOK_RESTARTS"  # gang restarts so far (attempt - 1)
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
SUCCEEDED, FAILED = "Succeeded", "Failed"

# Exit codes of the gang itself (a member's own codes pass through).
EXIT_LOST = 129  # a member's launcher went away mid-run (pod deleted, evicted, node lost): retryable
EXIT_DEADLINE = 124  # active-deadline-seconds passed: permanent, as timeout(1) reports it
EXIT_NOT_ASSEMBLED = 1  # members did not join (or come back) in time
PORT_SHIFT_WINDOW = 64  # attempts shift MASTER_PORT by (attempt - 1) mod this


@dataclass(frozen=True)
class Policy:
    """What the gang does about failures and time, read from the environment of rank 0 (the coordinator)."""

    on_failure: str = FAIL_GANG
    max_restarts: int = DEFAULT_MAX_RESTARTS
    deadline: float | None = None  # active-deadline-seconds
    join_timeout: float = 600.0  # how long members may take to join, or to come back for a restart
    rules: FailureRules = FailureRules()  # which failures restart-gang retries (trainhook.dev/failure-rules)
    settle: float = DEFAULT_FAILURE_SETTLE  # see TH_FAILURE_SETTLE


@dataclass(frozen=True)
class Settings:
    """Everything one launcher needs beyond its gang: the policy, ports, graces, and where it runs."""

    policy: Policy
    # The gang's signing key (gang_protocol), from the notary (identity.py): never from the environment, so
    # read_settings leaves it empty and the launcher fills it in once the notary has answered.
    key: bytes
    port: int
    finish_grace: float
    stop_grace: float
    restart_policy: str  # Always: the container is restarted when the launcher exits, so it parks instead
    workload_kind: str  # StatefulSet, Job, Pod or "" (unknown)
    workload_name: str
    state_dir: str
    local_status: str
    # The notary the webhook named (TRAINHOOK_NOTARY, TRAINHOOK_NOTARY_CA; "" when none): where the key comes
    # from and where the coordinator records the outcome.
    notary_url: str = ""
    notary_ca: str = ""
    identity_token: str = IDENTITY_TOKEN_FILE

    @property
    def parks(self) -> bool:
        """Whether the launcher must stay up once the gang is done (its container would be rerun otherwise)."""
        return self.restart_policy == "Always"


def _number(env: Mapping[str, str], name: str, default: float, problems: list[str], integer: bool = False,
            low: float = 0.0, high: float = 1e9) -> float:
    """`parse_number` with the default kept when the value is malformed (the problem is still reported)."""
    value = parse_number(env, name, default, low, high, problems, integer)
    return default if value is None else float(value)


def workload_of(env: Mapping[str, str], gang: Gang) -> tuple[str, str]:
    """(kind, name) of this pod's workload: TRAINHOOK_WORKLOAD when the webhook injects it; otherwise an Indexed
    Job's pods are known by JOB_COMPLETION_INDEX (set by the Job controller), and anything else is taken for a
    StatefulSet, whose name is the role's hostname prefix (`<sts>-<ordinal>`)."""
    text = env.get(TH_WORKLOAD, "").strip()
    prefix = gang.me.address.split(".", 1)[0].rsplit("-", 1)[0]
    if text:
        kind, _, name = text.partition("/")
        return kind, name
    if env.get("JOB_COMPLETION_INDEX", "").strip():
        return "Job", prefix
    return "StatefulSet", prefix


def read_settings(env: Mapping[str, str], gang: Gang) -> Settings:
    """The lifecycle settings from the environment; ConfigError naming every bad variable."""
    problems: list[str] = []
    on_failure = env.get(TH_ON_FAILURE, "").strip() or FAIL_GANG
    if on_failure not in ON_FAILURE_VALUES:
        problems.append(f"{TH_ON_FAILURE}={on_failure!r}: use {' or '.join(ON_FAILURE_VALUES)} "
                        f"(the {ON_FAILURE} annotation)")
    max_restarts = int(_number(env, TH_MAX_RESTARTS, DEFAULT_MAX_RESTARTS, problems, integer=True, high=10000))
    deadline = _number(env, TH_ACTIVE_DEADLINE, 0.0, problems, integer=True)
    port = int(_number(env, TH_COORDINATOR_PORT, COORDINATOR_PORT, problems, integer=True, low=1, high=65535))
    finish = _number(env, TH_FINISH_GRACE, DEFAULT_FINISH_GRACE, problems)
    stop = _number(env, TH_STOP_GRACE, DEFAULT_STOP_GRACE, problems)
    settle = _number(env, TH_FAILURE_SETTLE, DEFAULT_FAILURE_SETTLE, problems, high=600)
    try:
        rules = FailureRules.from_text(env.get(TH_FAILURE_RULES))
    except RulesError as e:
        rules = FailureRules()
        problems.append(f"{TH_FAILURE_RULES}={env.get(TH_FAILURE_RULES)!r}: {e} (the {keys.FAILURE_RULES} "
                        f"annotation: rules like {keys.RESTART_GANG}: SIGKILL, 1; {keys.FAIL_GANG}: 3)")
    kind, name = workload_of(env, gang)
    restart = env.get(TH_RESTART_POLICY, "").strip() or ("Never" if kind == "Job" else "Always")
    if restart not in RESTART_POLICIES:
        problems.append(f"{TH_RESTART_POLICY}={restart!r}: not a pod restartPolicy ({', '.join(RESTART_POLICIES)})")
    if problems:
        raise ConfigError(problems)
    policy = Policy(on_failure, max_restarts, deadline or None, gang.wait_timeout or 600.0, rules, settle)
    return Settings(policy=policy, key=b"", port=port,
                    finish_grace=finish, stop_grace=stop, restart_policy=restart, workload_kind=kind,
                    workload_name=name, state_dir=env.get(TH_STATE_DIR, "").strip(),
                    local_status=env.get(TH_LOCAL_STATUS, "").strip(),
                    notary_url=env.get(keys.TH_NOTARY, "").strip(), notary_ca=env.get(keys.TH_NOTARY_CA, ""),
                    identity_token=env.get(TH_IDENTITY_TOKEN, "").strip() or IDENTITY_TOKEN_FILE)


@dataclass(frozen=True)
class Outcome:
    """How the gang ended. `rank` is the member that decided it (rank 0 for success, the failing member else)."""

    phase: str  # SUCCEEDED or FAILED
    code: int
    reason: str
    rank: int
    time: str  # RFC 3339 UTC
    attempt: int = 0
    restarts: int = 0

    @property
    def succeeded(self) -> bool:
        return self.phase == SUCCEEDED

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> Outcome:
        """Rebuild an outcome received from a peer or read from a marker; ValueError when it is not one."""
        try:
            phase, code = str(data["phase"]), int(data["code"])
            if phase not in (SUCCEEDED, FAILED):
                raise ValueError(f"phase {phase!r}")
            return cls(phase, code, str(data.get("reason", "")), int(data.get("rank", 0)),
                       str(data.get("time", "")), int(data.get("attempt", 0)), int(data.get("restarts", 0)))
        except (KeyError, TypeError) as e:
            raise ValueError(f"not an outcome: {e}") from e

    def annotations(self) -> dict[str, str]:
        """What the launcher records on the workload."""
        return {PHASE: self.phase, PHASE_TIME: self.time, PHASE_REASON: self.reason, EXIT_CODE: str(self.code)}

    @classmethod
    def from_annotations(cls, annotations: Mapping[str, str]) -> Outcome | None:
        """The outcome recorded on a workload, or None when it carries none (or one we cannot read)."""
        phase = annotations.get(PHASE, "")
        if phase not in (SUCCEEDED, FAILED):
            return None
        code_text = annotations.get(EXIT_CODE, "")
        code = int(code_text) if code_text.isdigit() else (0 if phase == SUCCEEDED else 1)
        return cls(phase, code, annotations.get(PHASE_REASON, ""), 0, annotations.get(PHASE_TIME, ""))

    def summary(self) -> str:
        restarts = f" after {self.restarts} gang restart{'s' if self.restarts != 1 else ''}" if self.restarts else ""
        return f"gang {self.phase.lower()}{restarts}: {self.reason} (exit {self.code})"


def now_rfc3339(now: dt.datetime | None = None) -> str:
    return (now or dt.datetime.now(dt.timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")


def attempt_env(env: Mapping[str, str], attempt: int) -> dict[str, str]:
    """The training command's environment for `attempt` (1-based): a fresh rendezvous on every gang restart.

    Every member computes the same values from the attempt number, so they meet each other and nobody from an
    older attempt: torch's MASTER_PORT/PET_MASTER_PORT move by (attempt - 1), and an elastic gang's rendezvous
    id gets `-attempt-N` appended (torchrun reads both at start). Attempt 1 keeps Kubeflow's values unchanged.
    """
    out = dict(env)
    out[TH_ATTEMPT] = str(attempt)
    out[TH_RESTARTS] = str(attempt - 1)
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
