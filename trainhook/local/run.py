"""One local run, in a cluster's order: admit, let the controllers make pods, admit those, then run them.

`admit_manifest` is the apiserver + controller-manager half (needs only the webhook); `run_pods` is the kubelet
half (needs root: network namespaces). The CLI glues them together and prints the outcome.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import yaml

from trainhook.local.admission import AdmissionClient
from trainhook.local.controllers import ADMIN_USER, job_warnings, pod_requests, store
from trainhook.local.envvars import Sources
from trainhook.local.manifest import JOB, Manifest, type_of
from trainhook.local.network import Network
from trainhook.local.podexec import install as install_podexec
from trainhook.local.pods import LocalPod
from trainhook.local.scaling import Scaler
from trainhook.local.state import ClusterState, build_local_pod, restart_policy, write_hosts_files
from trainhook.local.supervisor import Output, RunResult, Supervisor

Warn = Callable[[str], None]


def _admit(client: AdmissionClient, obj: dict, user: dict, warn: Warn, rng: random.Random) -> dict:
    result = client.admit(obj, user)
    for message in result.warnings:
        warn(message)
    return store(result.obj, rng)


def admit_manifest(manifest: Manifest, client: AdmissionClient, warn: Warn,
                   rng: random.Random | None = None) -> ClusterState:
    """Admit every Service and workload, then every pod their controllers create (raises AdmissionError)."""
    rng = rng or random.Random()
    state = ClusterState()
    for service in manifest.services:
        state.services.append(_admit(client, service, ADMIN_USER, warn, rng))
    for workload in manifest.workloads:
        state.workloads.append(_admit(client, workload, ADMIN_USER, warn, rng))
    for workload in state.workloads:
        if type_of(workload) == JOB:
            for message in job_warnings(workload):
                warn(message)
        requests = pod_requests(workload)
        if not requests:  # a bare Pod: admitted above as the user created it
            state.pods.append(workload)
        for request in requests:
            state.pods.append(_admit(client, request.pod, request.user, warn, rng))
    return state


def address_warnings(state: ClusterState) -> list[str]:
    """Pods whose `<hostname>.<subdomain>` a cluster would not resolve: no headless Service of that name."""
    services = {(s["metadata"]["namespace"], s["metadata"]["name"]): s for s in state.services}
    problems = []
    for subdomain, namespace in sorted({(p["spec"].get("subdomain"), p["metadata"]["namespace"])
                                        for p in state.pods if (p.get("spec") or {}).get("subdomain")}):
        service = services.get((namespace, subdomain))
        if service is None:
            problems.append(f"no Service {subdomain!r} in namespace {namespace!r}: in a cluster the pods' "
                            f"addresses <hostname>.{subdomain} would not resolve (resolved here anyway)")
        elif (service.get("spec") or {}).get("clusterIP") != "None":
            problems.append(f"Service {subdomain!r} is not headless (clusterIP: None): in a cluster the pods' "
                            f"addresses <hostname>.{subdomain} would not resolve (resolved here anyway)")
    return problems


def pods_yaml(pods: list[dict]) -> str:
    return yaml.safe_dump_all(pods, sort_keys=False, default_flow_style=False)


def prepare_pods(state: ClusterState, manifest: Manifest, network: Network, run_dir: Path,
                 cluster_domain: str) -> list[LocalPod]:
    """Give every pod its namespace and address, write its hosts file and volumes, resolve its containers."""
    nets = {p["metadata"]["name"]: network.add_pod() for p in state.pods}
    state.nets = nets
    state.notary_ip = network.gateway
    write_hosts_files(state, nets, run_dir, cluster_domain)
    sources = Sources(manifest.configmaps, manifest.secrets)
    local = [build_local_pod(pod, nets[pod["metadata"]["name"]], run_dir, sources) for pod in state.pods]
    install_podexec(run_dir)  # RUN_DIR/podexec: how the launcher's local MPI transport enters another pod
    return local


OUTCOME_FILE = "outcome.json"


def outcome_document(result: RunResult) -> dict:
    """What `trainhook local` leaves in RUN_DIR/outcome.json: the run's and every gang's outcome, per pod."""
    return {
        "exitCode": result.exit_code, "reason": result.reason, "firstFailure": result.first_failure,
        "gangs": result.gangs,
        "pods": [{"name": p.name, "rank": p.rank, "exitCode": p.exit_code, "reason": p.reason,
                  "restarts": p.restarts, "gang": p.gang} for p in result.pods],
    }


def run_pods(pods: list[LocalPod], run_dir: Path, timeout: float | None, grace_seconds: float | None,
             stream: BinaryIO | None = None, scaler: Scaler | None = None) -> RunResult:
    """Run the pods to the end (see supervisor); output lines go to `stream` (default stdout). Containers are
    restarted per each pod's restartPolicy (read from the stored pod that `prepare_pods` kept in its directory);
    the outcome is also written to RUN_DIR/outcome.json. With a `scaler`, `trainhook local scale` requests are
    answered while the pods run."""
    output = Output(stream or sys.stdout.buffer, run_dir / "logs")
    policies = {pod.name: restart_policy(run_dir / "pods" / pod.name) for pod in pods}
    supervisor = Supervisor(pods, output, timeout, grace_seconds, policies, run_dir)

    async def supervise() -> RunResult:
        serving = asyncio.create_task(scaler.serve(supervisor)) if scaler is not None else None
        try:
            return await supervisor.run()
        finally:
            if serving is not None:
                serving.cancel()
                await asyncio.gather(serving, return_exceptions=True)

    result = asyncio.run(supervise())
    (run_dir / OUTCOME_FILE).write_text(json.dumps(outcome_document(result), indent=1))
    return result
