"""Local pods: a stored pod object turned into what runs on this machine, and the way into a running pod.

A `LocalPod` is the sandbox (network namespace, IP, hosts file, hostname, volumes) plus one `ContainerSpec` per
container, each with its command line, environment and mounts already resolved the way the kubelet resolves
them. `entry_argv` is the only way in, for the pod's own containers and for `exec_in_pod` alike (kubectl exec:
the MPI launcher's rsh agent needs it), so every process of a pod sees the same view.
Each pod's sandbox is saved as JSON in the run directory, so another process can exec into it too
(`python -m trainhook.local.podexec RUN_DIR POD -- CMD`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from trainhook.gang import keys
from trainhook.local.envvars import PodFacts, Sources, base_env, command_line, container_env
from trainhook.local.images import image_bin, runs_launcher_image
from trainhook.local.volumes import Mount, container_mounts, prepare_volumes

DEFAULT_GRACE_SECONDS = 30.0  # Kubernetes' default terminationGracePeriodSeconds
SANDBOX_FILE = "sandbox.json"
# Run as a script (`python -I -S PODINIT`), not with -m: see its docstring.
PODINIT = str(Path(__file__).with_name("podinit.py"))
ContainerKind = Literal["init", "sidecar", "main"]


@dataclass
class ContainerSpec:
    """One container, resolved: what to run, with which environment and mounts."""

    name: str
    kind: ContainerKind
    command: list[str]
    env: dict[str, str]
    mounts: list[Mount] = field(default_factory=list)
    workdir: str | None = None
    training: bool = False  # the container trainhook injects into (the trainhook.dev/container one)


@dataclass
class LocalPod:
    """A pod as it runs here."""

    name: str
    namespace: str
    hostname: str
    ip: str
    netns_path: str
    hosts_path: str
    init_containers: list[ContainerSpec]
    containers: list[ContainerSpec]
    grace_seconds: float = DEFAULT_GRACE_SECONDS

    @property
    def training_container(self) -> ContainerSpec:
        return next((c for c in self.containers if c.training), self.containers[0])

    @property
    def rank(self) -> str:
        """TRAINHOOK_RANK of the training container, as the webhook injected it ("" when not a gang member)."""
        return self.training_container.env.get(keys.TH_RANK, "")

    def container(self, name: str | None = None) -> ContainerSpec:
        if name is None:
            return self.training_container
        for spec in self.init_containers + self.containers:
            if spec.name == name:
                return spec
        raise KeyError(f"pod {self.name} has no container {name!r}")

    def entry_argv(self, spec: ContainerSpec, command: list[str] | None = None) -> list[str]:
        """The full command line that runs `command` (default: the container's own) inside this pod."""
        argv = ["nsenter", f"--net={self.netns_path}", "unshare", "--mount", "--uts", "--propagation", "private",
                "--", sys.executable, "-I", "-S", PODINIT, "--hosts", self.hosts_path,
                "--hostname", self.hostname]
        for mount in spec.mounts:
            argv += ["--mount", mount.to_arg()]
        if spec.workdir:
            argv += ["--workdir", spec.workdir]
        return argv + ["--", *(spec.command if command is None else command)]

    def save(self, directory: Path) -> Path:
        path = directory / SANDBOX_FILE
        path.write_text(json.dumps(asdict(self), indent=2))
        return path

    @classmethod
    def load(cls, path: Path) -> LocalPod:
        data = json.loads(path.read_text())

        def spec(d: dict) -> ContainerSpec:
            return ContainerSpec(**{**d, "mounts": [Mount(**m) for m in d["mounts"]]})
        return cls(**{**data, "init_containers": [spec(c) for c in data["init_containers"]],
                      "containers": [spec(c) for c in data["containers"]]})


def exec_in_pod(pod: LocalPod, command: list[str], container: str | None = None,
                env: dict[str, str] | None = None, **popen: Any) -> subprocess.Popen:
    """Start `command` inside a running local pod, as `kubectl exec POD -c CONTAINER -- COMMAND` does: in the
    pod's network, with its hosts file, hostname and the container's mounts, working directory and environment."""
    spec = pod.container(container)
    return subprocess.Popen(pod.entry_argv(spec, command), env=spec.env if env is None else env, **popen)


def training_container_name(pod: dict) -> str:
    containers = (pod.get("spec") or {}).get("containers") or []
    named = ((pod.get("metadata") or {}).get("annotations") or {}).get(keys.CONTAINER)
    return named or (containers[0].get("name", "") if containers else "")


def build_pod(pod: dict, ip: str, netns_path: str, hosts_path: Path, pod_dir: Path, claims_dir: Path,
              sources: Sources) -> LocalPod:
    """Resolve a stored pod for this machine: volumes written, env and commands computed (raises EnvError)."""
    meta = pod["metadata"]
    spec = pod.get("spec") or {}
    hostname = spec.get("hostname") or meta["name"]
    volumes = prepare_volumes(pod, pod_dir, claims_dir, sources)
    facts = PodFacts(pod_ip=ip)
    training = training_container_name(pod)
    users_image = str(image_bin(pod_dir.parent.parent))  # RUN_DIR/pods/POD -> RUN_DIR/image-bin

    def resolve(container: dict, kind: ContainerKind) -> ContainerSpec:
        own = container_env(container, pod, facts, sources)  # `$(VAR)` in commands sees only these
        path_first = None if runs_launcher_image(container) else users_image
        return ContainerSpec(name=container.get("name", ""), kind=kind, command=command_line(container, own, pod),
                             env={**base_env(hostname, image_bin=path_first), **own},
                             mounts=container_mounts(container, volumes), workdir=container.get("workingDir"),
                             training=kind == "main" and container.get("name") == training)

    inits = [resolve(c, "sidecar" if c.get("restartPolicy") == "Always" else "init")
             for c in spec.get("initContainers") or []]
    mains = [resolve(c, "main") for c in spec.get("containers") or []]
    grace = spec.get("terminationGracePeriodSeconds")
    return LocalPod(name=meta["name"], namespace=meta["namespace"], hostname=hostname, ip=ip,
                    netns_path=netns_path, hosts_path=str(hosts_path), init_containers=inits, containers=mains,
                    grace_seconds=float(DEFAULT_GRACE_SECONDS if grace is None else grace))
