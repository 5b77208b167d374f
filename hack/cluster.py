#!/usr/bin/env python3
"""A local Kubernetes v1.20 control plane for the tests: etcd, kube-apiserver, kube-controller-manager
(and, on request, kube-scheduler), all on 127.0.0.1 with ports picked at start.

No kubelet: pods are admitted, defaulted, created by their controllers and then stay Pending. That is
enough for admission webhooks, controllers, RBAC and API calls. The binaries come from hack/k8s-build.sh.

    python hack/cluster.py up [--state-dir DIR] [--scheduler]   # start, record PIDs, print KUBECONFIG
    python hack/cluster.py env [--state-dir DIR]                # print `export KUBECONFIG=...`
    python hack/cluster.py down [--state-dir DIR]               # stop what `up` started

As a module (what tests/support/cluster_api.py does):

    cp = start(state_dir)        # ControlPlane: .host, .kubeconfig, .api_client(), .stop()

This file is what runs the control plane: the binaries, the components' command lines, the readiness waits, the
record of a running one and the CLI. Its certificates and kubeconfigs are made by hack/cluster_certs.py (its
`kubeconfig_dict`, which the tests use, is reachable here too), and its daemons are supervised by PID with
hack/processes.py, which hack/node.py shares.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

HACK_DIR = Path(__file__).resolve().parent
if str(HACK_DIR) not in sys.path:  # its siblings, also when loaded from a path (tests/support/cluster_api.py)
    sys.path.insert(0, str(HACK_DIR))

import processes  # noqa: E402
from cluster_certs import write_control_plane_files  # noqa: E402
from cluster_certs import kubeconfig_dict  # noqa: E402, F401  the tests' `cluster.kubeconfig_dict`

if TYPE_CHECKING:
    from trainhook.certs.build import KeyPair

K8S_VERSION = "1.20.2"
BUILD_SCRIPT = HACK_DIR / "k8s-build.sh"
SERVICE_CIDR = "10.0.0.0/24"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
ADMISSION_PLUGINS = ["NamespaceLifecycle", "LimitRanger", "ServiceAccount", "DefaultTolerationSeconds",
                     "MutatingAdmissionWebhook", "ValidatingAdmissionWebhook", "ResourceQuota", "Priority"]
STATE_FILE = "cluster.json"


class ClusterError(RuntimeError):
    """The control plane could not be built, started or reached."""


def cache_dir() -> Path:
    return Path(os.environ.get("TRAINHOOK_CACHE") or Path.home() / ".cache" / "trainhook")


def bin_dir() -> Path:
    """Where the binaries are: $TRAINHOOK_K8S_BIN (prebuilt, used as is) or the build script's cache."""
    override = os.environ.get("TRAINHOOK_K8S_BIN")
    return Path(override) if override else cache_dir() / f"k8s-v{K8S_VERSION}" / "bin"


def default_state_dir() -> Path:
    return cache_dir() / "cluster"


def ensure_binaries(quiet: bool = False) -> Path:
    """Run hack/k8s-build.sh (it returns at once when the binaries are current) unless $TRAINHOOK_K8S_BIN."""
    bins = bin_dir()
    if not os.environ.get("TRAINHOOK_K8S_BIN"):
        # Its progress goes to stderr (fd 2), so `eval "$(python hack/cluster.py up)"` sees only the export.
        proc = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE if quiet else 2,
                              stderr=subprocess.STDOUT if quiet else None, text=True)
        if proc.returncode != 0:
            raise ClusterError(f"{BUILD_SCRIPT} failed (exit {proc.returncode})"
                               + (f":\n{proc.stdout[-6000:]}" if quiet else ""))
    missing = [n for n in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
               if not os.access(bins / n, os.X_OK)]
    if missing:
        raise ClusterError(f"missing in {bins}: {', '.join(missing)} (run hack/k8s-build.sh)")
    return bins


@dataclass
class ControlPlane:
    """A running control plane. `stop()` ends every process it started (by PID)."""

    state_dir: Path
    host: str
    kubeconfig: Path
    ca_file: Path
    ports: dict[str, int]
    pids: dict[str, int] = field(default_factory=dict)
    logs: dict[str, str] = field(default_factory=dict)
    # The Popen objects of processes started by this Python process (kept so that they are never
    # reaped behind our back by subprocess's garbage collection of Popen objects).
    procs: dict[str, subprocess.Popen] = field(default_factory=dict, repr=False, compare=False)

    def alive(self, name: str) -> bool:
        proc = self.procs.get(name)
        if proc is not None:
            return proc.poll() is None
        return processes.alive(self.pids[name]) and processes.is_ours(self.pids[name], str(self.state_dir))

    @property
    def ca_pem(self) -> bytes:
        return self.ca_file.read_bytes()

    def api_client(self):
        """A fresh `kubernetes.client.ApiClient` for the admin user (group system:masters)."""
        from kubernetes import config
        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def token_client(self, token: str):
        """An ApiClient that authenticates with a bearer token (a ServiceAccount's, say)."""
        from kubernetes import client
        configuration = client.Configuration()
        configuration.host = self.host
        configuration.ssl_ca_cert = str(self.ca_file)
        configuration.api_key = {"authorization": f"Bearer {token}"}
        return client.ApiClient(configuration)

    def env(self) -> dict[str, str]:
        return {"KUBECONFIG": str(self.kubeconfig)}

    def log(self, component: str, lines: int = 40) -> str:
        return processes.tail(Path(self.logs[component]), lines)

    def running(self) -> bool:
        return bool(self.pids) and all(self.alive(name) for name in self.pids)

    def stop(self) -> None:
        # Reverse start order: controllers first, etcd last.
        for name in reversed(list(self.pids)):
            proc = self.procs.get(name)
            if proc is None:
                processes.stop_pid(self.pids[name], str(self.state_dir))
                continue
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.pids.clear()
        self.procs.clear()
        (self.state_dir / STATE_FILE).unlink(missing_ok=True)

    def save(self) -> None:
        data = {"host": self.host, "kubeconfig": str(self.kubeconfig), "ca_file": str(self.ca_file),
                "ports": self.ports, "pids": self.pids, "logs": self.logs}
        (self.state_dir / STATE_FILE).write_text(json.dumps(data, indent=1))

    @classmethod
    def load(cls, state_dir: Path) -> ControlPlane | None:
        try:
            data = json.loads((state_dir / STATE_FILE).read_text())
        except (OSError, ValueError):
            return None
        return cls(state_dir=state_dir, host=data["host"], kubeconfig=Path(data["kubeconfig"]),
                   ca_file=Path(data["ca_file"]), ports=data["ports"], pids=data["pids"], logs=data["logs"])


def _https_get(url: str, ctx: ssl.SSLContext, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def start(state_dir: Path | None = None, *, scheduler: bool = False, timeout: float = 90.0,
          wait_for_controllers: bool = True, die_with_parent: bool = True, verbosity: int = 1,
          bins: Path | None = None, address: str = "127.0.0.1", ca: KeyPair | None = None,
          extra_apiserver_args: list[str] = (), kube_api_qps: int = 0, kube_api_burst: int = 0) -> ControlPlane:
    """Start etcd, kube-apiserver, kube-controller-manager (and kube-scheduler) and wait until the API
    answers /readyz and the controllers have given the `default` ServiceAccount its token.

    `state_dir` holds certificates, kubeconfigs, etcd's data and the logs (a fresh temp dir when None).
    On any failure every process started so far is stopped before the ClusterError is raised.

    For a node (hack/node.py): `address` binds and advertises the API server on an address pods reach (its
    serving certificate names it, and the `kubernetes` Service's endpoint is kept there by the lease
    reconciler); `ca` is the cluster's CA when the caller signs its own components' certificates with it;
    `extra_apiserver_args` are appended (the kubelet client certificate, say).

    `kube_api_qps`/`kube_api_burst` (0: the controller-manager's own defaults, 20 and 30 requests a second):
    its client's rate to the API server, the same flags a real cluster's controller-manager has. The default
    makes a StatefulSet of 10,000 pods take 8 minutes; bench/gang_scale_sim.py raises it for large gangs."""
    bins = bins or ensure_binaries()
    state_dir = Path(state_dir or tempfile.mkdtemp(prefix="trainhook-k8s-")).resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    loopback = address == "127.0.0.1"
    ports = {"etcd": processes.free_port(), "etcd-peer": processes.free_port(),
             "apiserver": processes.free_port(address)}
    host = f"https://{address}:{ports['apiserver']}"
    files = write_control_plane_files(state_dir, host, ca, extra_sans=[] if loopback else [address])

    etcd_url = f"http://127.0.0.1:{ports['etcd']}"
    peer_url = f"http://127.0.0.1:{ports['etcd-peer']}"
    commands: dict[str, list[str]] = {
        "etcd": [
            str(bins / "etcd"), "--name", "trainhook", "--data-dir", str(state_dir / "etcd"),
            "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"trainhook={peer_url}", "--initial-cluster-state", "new",
            "--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn",
            "--quota-backend-bytes", str(512 * 1024 * 1024), "--snapshot-count", "5000",
        ],
        "kube-apiserver": [
            str(bins / "kube-apiserver"),
            "--etcd-servers", etcd_url, "--etcd-prefix", "/registry",
            "--bind-address", address, "--advertise-address", address,
            "--secure-port", str(ports["apiserver"]), "--insecure-port", "0",
            "--tls-cert-file", str(files.apiserver_cert), "--tls-private-key-file", str(files.apiserver_key),
            "--client-ca-file", str(files.ca),
            "--service-account-key-file", str(files.sa_pub),
            "--service-account-signing-key-file", str(files.sa_key),
            "--service-account-issuer", SERVICE_ACCOUNT_ISSUER,
            "--api-audiences", SERVICE_ACCOUNT_ISSUER,
            "--service-cluster-ip-range", SERVICE_CIDR,
            "--authorization-mode", "Node,RBAC",
            "--enable-admission-plugins", ",".join(ADMISSION_PLUGINS),
            "--allow-privileged=true",
            "--cert-dir", str(state_dir / "apiserver-certs"),
            "--profiling=false", "--enable-priority-and-fairness=false",
            "--event-ttl", "10m",
            # On loopback the `kubernetes` Service's endpoint would be 127.0.0.1, which Endpoints refuse, and
            # no pod runs to use it; on a node's address pods reach the API through that Service.
            "--endpoint-reconciler-type", "none" if loopback else "lease",
            "--v", str(verbosity),
            *extra_apiserver_args,
        ],
        "kube-controller-manager": [
            str(bins / "kube-controller-manager"),
            "--kubeconfig", str(files.kcm_kubeconfig),
            "--service-account-private-key-file", str(files.sa_key),
            "--root-ca-file", str(files.ca),
            "--cluster-signing-cert-file", str(files.ca), "--cluster-signing-key-file", str(files.ca_key),
            "--controllers", "*", "--use-service-account-credentials",
            "--service-cluster-ip-range", SERVICE_CIDR,
            "--leader-elect=false", "--port", "0", "--secure-port", "0", "--profiling=false",
            "--v", str(verbosity),
            *([f"--kube-api-qps={kube_api_qps}"] if kube_api_qps else []),
            *([f"--kube-api-burst={kube_api_burst}"] if kube_api_burst else []),
        ],
    }
    if scheduler:
        commands["kube-scheduler"] = [
            str(bins / "kube-scheduler"), "--kubeconfig", str(files.sched_kubeconfig),
            "--leader-elect=false", "--port", "0", "--secure-port", "0", "--profiling=false",
            "--v", str(verbosity),
        ]

    cp = ControlPlane(state_dir=state_dir, host=host, kubeconfig=files.kubeconfig, ca_file=files.ca, ports=ports)
    ctx = ssl.create_default_context(cafile=str(files.ca))
    ctx.load_cert_chain(str(files.admin_cert), str(files.admin_key))
    deadline = time.monotonic() + timeout
    try:
        for name, command in commands.items():
            log = state_dir / f"{name}.log"
            cp.logs[name] = str(log)
            with log.open("wb") as out:
                proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                        cwd=state_dir, start_new_session=True,
                                        preexec_fn=processes.parent_death_signal if die_with_parent else None)
            cp.pids[name] = proc.pid
            cp.procs[name] = proc
            cp.save()
            if name == "etcd":
                _wait(lambda: _etcd_healthy(etcd_url), deadline, cp, "etcd", "etcd /health")
            elif name == "kube-apiserver":
                _wait(lambda: _https_get(host + "/readyz", ctx)[0] == 200, deadline, cp, "kube-apiserver",
                      f"{host}/readyz")
        if wait_for_controllers:
            _wait(lambda: _default_sa_has_token(host, ctx), deadline, cp, "kube-controller-manager",
                  "the `default` ServiceAccount's token (the controllers' first work)")
    except BaseException:
        cp.stop()
        raise
    return cp


def _etcd_healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as resp:
            return json.loads(resp.read()).get("health") == "true"
    except (OSError, ValueError):
        return False


def _default_sa_has_token(host: str, ctx: ssl.SSLContext) -> bool:
    status, body = _https_get(host + "/api/v1/namespaces/default/serviceaccounts/default", ctx)
    return status == 200 and bool(json.loads(body).get("secrets"))


def _wait(ready, deadline: float, cp: ControlPlane, component: str, what: str) -> None:
    while True:
        for name in cp.pids:
            if not cp.alive(name):
                raise ClusterError(f"{name} exited while waiting for {what}; last lines of {cp.logs[name]}:\n"
                                   f"{cp.log(name)}")
        try:
            if ready():
                return
        except (OSError, ValueError, ssl.SSLError):
            pass
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out waiting for {what}; last lines of {cp.logs[component]}:\n"
                               f"{cp.log(component)}")
        time.sleep(0.2)


# ---- CLI --------------------------------------------------------------------------------------------

def _cmd_up(args) -> int:
    state_dir = Path(args.state_dir).resolve()
    existing = ControlPlane.load(state_dir)
    if existing and existing.running():
        print(f"control plane already running at {existing.host}", file=sys.stderr)
        print(f"export KUBECONFIG={existing.kubeconfig}")
        return 0
    if existing:
        existing.stop()
    for stale in ("etcd", "pki", "apiserver-certs"):
        shutil.rmtree(state_dir / stale, ignore_errors=True)
    t0 = time.monotonic()
    cp = start(state_dir, scheduler=args.scheduler, timeout=args.timeout, die_with_parent=False)
    cp.save()
    print(f"control plane v{K8S_VERSION} up at {cp.host} in {time.monotonic() - t0:.1f}s "
          f"(pids {' '.join(f'{n}={p}' for n, p in cp.pids.items())}; logs in {state_dir})", file=sys.stderr)
    print(f"export KUBECONFIG={cp.kubeconfig}")
    return 0


def _cmd_down(args) -> int:
    state_dir = Path(args.state_dir).resolve()
    cp = ControlPlane.load(state_dir)
    if cp is None:
        print(f"no control plane recorded in {state_dir}", file=sys.stderr)
        return 0
    cp.stop()
    print(f"control plane in {state_dir} stopped", file=sys.stderr)
    return 0


def _cmd_env(args) -> int:
    cp = ControlPlane.load(Path(args.state_dir).resolve())
    if cp is None or not cp.running():
        print("no running control plane; run `python hack/cluster.py up`", file=sys.stderr)
        return 1
    print(f"export KUBECONFIG={cp.kubeconfig}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("up", "down", "env"):
        p = sub.add_parser(name)
        p.add_argument("--state-dir", default=str(default_state_dir()),
                       help="certificates, kubeconfig, etcd data, logs and PIDs (default: %(default)s)")
        if name == "up":
            p.add_argument("--scheduler", action="store_true", help="also run kube-scheduler")
            p.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for readiness")
    args = parser.parse_args(argv)
    try:
        return {"up": _cmd_up, "down": _cmd_down, "env": _cmd_env}[args.command](args)
    except ClusterError as e:
        print(f"cluster: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
