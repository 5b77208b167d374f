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
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import yaml

from trainhook.local.admission import NOTARY_HOST, AdmissionClient
from trainhook.local.controllers import ADMIN_USER, job_warnings, pod_requests, store
from trainhook.local.envvars import EnvError, Sources
from trainhook.local.manifest import JOB, Manifest, type_of
from trainhook.local.network import HostEntry, Network, PodNet, hosts_file
from trainhook.local.podexec import install as install_podexec
from trainhook.local.pods import LocalPod, build_pod
from trainhook.local.scaling import Scaler
from trainhook.local.supervisor import Output, RunResult, Supervisor

Warn = Callable[[str], None]


@dataclass
class ClusterState:
    """What the apiserver holds after `kubectl apply` and the controllers' pod creations."""

    services: list[dict] = field(default_factory=list)
    workloads: list[dict] = field(default_factory=list)
    pods: list[dict] = field(default_factory=list)  # stored pods, in creation order
    nets: dict[str, PodNet] = field(default_factory=dict)  # pod name -> its network (once prepared)
    notary_ip: str = ""  # where pods reach the notary's relay (the bridge's address), once the network exists


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


def _selects(service: dict, pod: dict) -> bool:
    selector = (service.get("spec") or {}).get("selector") or {}
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return bool(selector) and service["metadata"]["namespace"] == pod["metadata"]["namespace"] and \
        all(labels.get(k) == v for k, v in selector.items())


def service_names(state: ClusterState, ips: dict[str, str], cluster_domain: str) -> dict[str, list[str]]:
    """Headless Services resolve to the IPs of the pods they select (every spelling, as with the pods)."""
    names: dict[str, list[str]] = {}
    for service in state.services:
        if (service.get("spec") or {}).get("clusterIP") != "None":
            continue
        selected = [ips[p["metadata"]["name"]] for p in state.pods if _selects(service, p)]
        if not selected:
            continue
        name, namespace = service["metadata"]["name"], service["metadata"]["namespace"]
        for spelling in (f"{name}.{namespace}.svc.{cluster_domain}", f"{name}.{namespace}.svc",
                         f"{name}.{namespace}", name):
            names[spelling] = selected
    return names


def write_hosts_files(state: ClusterState, nets: dict[str, PodNet], run_dir: Path, cluster_domain: str) -> None:
    """Every pod's hosts file: itself and every pod of the run, as cluster DNS resolves them now. Written in
    place (the same file stays bind-mounted at the pod's /etc/hosts), so running pods learn of pods added by a
    scale-up, and forget deleted ones, as they would through DNS."""
    entries = [HostEntry(nets[p["metadata"]["name"]].ip, p["spec"].get("hostname") or p["metadata"]["name"],
                         p["spec"].get("subdomain", ""), p["metadata"]["namespace"]) for p in state.pods]
    services = service_names(state, {name: net.ip for name, net in nets.items()}, cluster_domain)
    if state.notary_ip:  # the name the webhook injects in TRAINHOOK_NOTARY (admission.NOTARY_URL)
        services[NOTARY_HOST] = [state.notary_ip]
    for pod, entry in zip(state.pods, entries):
        pod_dir = run_dir / "pods" / pod["metadata"]["name"]
        pod_dir.mkdir(parents=True, exist_ok=True)
        (pod_dir / "hosts").write_text(hosts_file(entry, entries, cluster_domain, services))


def build_local_pod(pod: dict, net: PodNet, run_dir: Path, sources: Sources) -> LocalPod:
    """One stored pod made runnable here (its hosts file written already): volumes, environment, commands."""
    name = pod["metadata"]["name"]
    pod_dir = run_dir / "pods" / name
    try:
        built = build_pod(pod, net.ip, net.netns_path, pod_dir / "hosts", pod_dir, run_dir / "claims", sources)
    except EnvError as e:  # the kubelet's CreateContainerConfigError, named by pod
        raise EnvError(f"pod {name}: {e}") from e
    built.save(pod_dir)
    (pod_dir / POD_FILE).write_text(json.dumps(pod, indent=1))  # the stored pod, as a kubelet reads it
    return built


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


POD_FILE = "pod.json"
OUTCOME_FILE = "outcome.json"


def restart_policy(pod_dir: Path) -> str:
    """The pod's spec.restartPolicy (the API server's default, Always, when unset)."""
    try:
        spec = json.loads((pod_dir / POD_FILE).read_text()).get("spec") or {}
    except (OSError, ValueError):
        return "Always"
    return spec.get("restartPolicy") or "Always"


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
