"""The run's cluster state (what the API server stores) and the files each pod gets from it: its hosts file (the
cluster's DNS), its stored pod (pod.json, as a kubelet reads it) and its runnable form (LocalPod).

Shared by the run's start (run.py) and a scale while it runs (scaling.py), which both make pods from the same
state; kept here so that neither imports the other.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from trainhook.local.admission import NOTARY_HOST
from trainhook.local.envvars import EnvError, Sources
from trainhook.local.network import HostEntry, PodNet, hosts_file
from trainhook.local.pods import LocalPod, build_pod

POD_FILE = "pod.json"


@dataclass
class ClusterState:
    """What the apiserver holds after `kubectl apply` and the controllers' pod creations."""

    services: list[dict] = field(default_factory=list)
    workloads: list[dict] = field(default_factory=list)
    pods: list[dict] = field(default_factory=list)  # stored pods, in creation order
    nets: dict[str, PodNet] = field(default_factory=dict)  # pod name -> its network (once prepared)
    notary_ip: str = ""  # where pods reach the notary's relay (the bridge's address), once the network exists


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


POD_FILE = "pod.json"


def restart_policy(pod_dir: Path) -> str:
    """The pod's spec.restartPolicy (the API server's default, Always, when unset)."""
    try:
        spec = json.loads((pod_dir / POD_FILE).read_text()).get("spec") or {}
    except (OSError, ValueError):
        return "Always"
    return spec.get("restartPolicy") or "Always"
