"""Gang outcomes as the launcher decides and records them, for the tests of what reads them (`trainhook status`,
`list`, `submit --wait`, the SDK). The annotations come from the launcher's own code, never written by hand: a
change of the launcher's format then breaks the readers' tests, instead of leaving them testing a format that
nothing writes.

- `decided(job, size, rank, code)`: the outcome the gang's coordinator decides (its pure decision machine,
  launcher/coordination/coordinator_rules.py's CoordinatorState, fed as members would feed it): `size` workers join and rank `rank` exits
  with `code` (rank 0 exiting 0 is success).
- `outcome.annotations()`: what the launcher writes on the workload.
- `record(api_client, kind, name, namespace, outcome)`: the launcher's writer from before the notary
  (tests/support/outcome_api.py, on the launcher's standard-library client, as the same user as the `kubernetes`
  ApiClient given), against a real API server.
"""

from __future__ import annotations

import ssl
import time
from urllib.parse import urlsplit

from trainhook.gang import keys
import outcome_api
from trainhook.launcher.mpi import kube_api
from trainhook.launcher.coordination.coordinator_rules import CoordinatorState
from trainhook.launcher.coordination.report import EXITED, Report
from trainhook.launcher.pod_view import parse_gang
from trainhook.launcher.outcome import Outcome
from trainhook.launcher.policy import GangPolicy


def rank0_env(job: str, namespace: str, size: int) -> dict[str, str]:
    """The gang variables the webhook injects into rank 0 of a one-StatefulSet PyTorch gang."""
    return {keys.TH_FRAMEWORK: "pytorch", keys.TH_JOB_NAME: job, keys.TH_NAMESPACE: namespace,
            keys.TH_ROLE: "worker", keys.TH_INDEX: "0", keys.TH_REPLICAS: f"worker={size}",
            keys.TH_HOSTS: f"worker={job}", keys.TH_SUBDOMAIN: job}


def decided(job: str, size: int = 2, rank: int = 0, code: int = 0, namespace: str = "ns") -> Outcome:
    state = CoordinatorState(parse_gang(rank0_env(job, namespace, size)), GangPolicy(), now=time.time())
    for member in range(size):
        state.joined(member, member + 1, Report())
    state.reported(rank, rank + 1, Report(attempt=state.attempt, status=EXITED, code=code, since=state.since))
    assert state.outcome is not None, state.log  # rank 0 exiting 0, or any rank failing, ends the gang
    return state.outcome


def launcher_client(api_client) -> kube_api.Client:
    """The launcher's own client (kube_api) for the server and user of a `kubernetes` ApiClient."""
    config = api_client.configuration
    context = ssl.create_default_context(cafile=config.ssl_ca_cert)
    if config.cert_file:
        context.load_cert_chain(config.cert_file, config.key_file)
    bearer = (config.api_key or {}).get("authorization", "").partition(" ")[2]
    url = urlsplit(config.host)
    return kube_api.Client(url.hostname, url.port or 443, context, (lambda: bearer) if bearer else None)


def record(api_client, kind: str, name: str, namespace: str, outcome: Outcome) -> None:
    outcome_api.record_outcome(launcher_client(api_client), kind, name, namespace, outcome)
