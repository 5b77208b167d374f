#!/usr/bin/env python3
"""A real single-node Kubernetes v1.20 cluster on this machine: the control plane of hack/cluster.py (bound on
the pod bridge's address, with kube-scheduler), containerd + runc over CRI, a CNI bridge pod network, kubelet,
kube-proxy (iptables) and a cluster DNS (hack/cluster_dns.py), with images built here (hack/images.py).

    python hack/node.py up   [--state-dir DIR] [--images pause,webhook,launcher,torch]
    python hack/node.py env  [--state-dir DIR]      # `export KUBECONFIG=...` (and PATH for kubectl)
    python hack/node.py down [--state-dir DIR]      # safe twice, and after a crash

`up` builds what is missing first (hack/k8s-build.sh all; the images), stops a node left over by a crash, then
starts everything and waits until the node is Ready, the DNS answers and kube-proxy has programmed the
`kubernetes` Service. Root is required (bridge, iptables, cgroups, mounts). The values and the reasons for them
are in hack/node_config.py; what it changes on the host, and how `down` puts it back, in hack/node_host.py; its
certificates and kubeconfigs, beside the control plane's, in hack/cluster_certs.py.

State: `DIR/run` (wiped at `up`: certificates, configs, logs, PIDs in node.json, kubelet and containerd state) and
`DIR/containerd` (containerd's content and snapshots: imported images, kept across runs). Default DIR:
`${TRAINHOOK_CACHE:-~/.cache/trainhook}/node`. One node per machine (the bridge and its subnet are fixed).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

HACK = Path(__file__).resolve().parent
sys.path.insert(0, str(HACK))

import cluster  # noqa: E402
import cluster_certs  # noqa: E402
import images as images_mod  # noqa: E402
import node_config as cfg  # noqa: E402
import node_host as host  # noqa: E402
import processes  # noqa: E402

NODE_FILE = "node.json"
DEFAULT_IMAGES = ("pause", "webhook", "launcher", "torch", "mpi", "tensorflow", "xgboost", "noshell", "bare")


def default_state_dir() -> Path:
    return cluster.cache_dir() / "node"


@dataclass
class Node:
    """A started node: what `down` needs (PIDs by component, paths) and what tests use (kubeconfig, images)."""

    state_dir: Path
    kubeconfig: str = ""
    host: str = ""
    images: dict[str, str] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict, repr=False)

    @property
    def paths(self) -> cfg.NodePaths:
        return cfg.NodePaths(run=self.state_dir / "run", images=self.state_dir / "containerd")

    def save(self) -> None:
        data = {"kubeconfig": self.kubeconfig, "host": self.host, "images": self.images, "pids": self.pids}
        (self.paths.run / NODE_FILE).write_text(json.dumps(data, indent=1))

    @classmethod
    def load(cls, state_dir: Path) -> Node | None:
        try:
            data = json.loads((state_dir / "run" / NODE_FILE).read_text())
        except (OSError, ValueError):
            return None
        return cls(state_dir=state_dir, kubeconfig=data["kubeconfig"], host=data["host"], images=data["images"],
                   pids=data["pids"])

    def alive(self, name: str) -> bool:
        pid = self.pids.get(name)
        return bool(pid) and processes.alive(pid) and processes.is_ours(pid, str(self.paths.run))

    def running(self) -> bool:
        cp = cluster.ControlPlane.load(self.paths.run / "control-plane")
        return bool(self.pids) and all(self.alive(n) for n in self.pids) and bool(cp and cp.running())

    def log(self, name: str, lines: int = 40) -> str:
        return processes.tail(self.paths.run / f"{name}.log", lines)

    def env(self) -> dict[str, str]:
        bins = cluster.bin_dir()
        return {"KUBECONFIG": self.kubeconfig, "PATH": f"{bins}:{os.environ.get('PATH', '')}"}

    def api_client(self):
        from kubernetes import config
        return config.new_client_from_config(config_file=self.kubeconfig)


@contextmanager
def _locked(state_dir: Path):
    """One `up` or `down` at a time per state dir (make, CI and a pytest fixture may race)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _say(msg: str) -> None:
    print(f"node: {msg}", file=sys.stderr, flush=True)


# ---- start -------------------------------------------------------------------------------------------------------

def _spawn(node: Node, name: str, command: list[str], die_with_parent: bool) -> None:
    log = node.paths.run / f"{name}.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                cwd=node.paths.run, start_new_session=True,
                                preexec_fn=processes.parent_death_signal if die_with_parent else None)
    node.pids[name] = proc.pid
    node.procs[name] = proc
    node.save()


def _wait(node: Node, what: str, ready, timeout: float, component: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        for name, proc in node.procs.items():
            if proc.poll() is not None:
                raise cluster.ClusterError(f"{name} exited (code {proc.returncode}) while waiting for {what}; "
                                           f"last lines of its log:\n{node.log(name)}")
        try:
            if ready():
                return
        except Exception:  # noqa: BLE001  not yet (connection refused, 404, ...)
            pass
        if time.monotonic() > deadline:
            raise cluster.ClusterError(f"timed out after {timeout:.0f}s waiting for {what}; last lines of "
                                       f"{component}'s log:\n{node.log(component)}")
        time.sleep(0.3)


def _start_containerd(node: Node, die_with_parent: bool) -> None:
    paths = node.paths
    _spawn(node, "containerd", ["containerd", "--config", str(paths.containerd_config)], die_with_parent)
    _wait(node, "containerd's socket", lambda: host.ctr(paths, "version").returncode == 0, 30, "containerd")


def _import_images(node: Node, built: dict) -> None:
    """Import the images not yet in containerd's store (kept across runs), and drop the ones an input change
    replaced (containerd's garbage collector then frees their layers)."""
    present = set(host.ctr(node.paths, "images", "ls", "-q").stdout.split())
    wanted = {image.ref for image in built.values()}
    stale = sorted(ref for ref in present if ref.startswith("localhost/trainhook/") and ref not in wanted)
    if stale:
        host.ctr(node.paths, "images", "rm", *stale, check=False)
    for image in built.values():
        if image.ref not in present:
            t0 = time.monotonic()
            host.ctr(node.paths, "images", "import", image.archive(images_mod.cache_dir()))
            _say(f"imported {image.ref} into containerd in {time.monotonic() - t0:.0f}s")


def _create_dns_service(api_client) -> None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException
    core = client.CoreV1Api(api_client)
    service, endpoints = cfg.dns_service_objects()
    for create in (lambda: core.create_namespaced_service("kube-system", service),
                   lambda: core.create_namespaced_endpoints("kube-system", endpoints)):
        try:
            create()
        except ApiException as e:
            if e.status != 409:
                raise


def _dns_answers(name: str) -> bool:
    """A UDP query for `name` A at the cluster DNS, through kube-proxy's Service rules."""
    from dnslib import DNSRecord
    reply = DNSRecord.parse(DNSRecord.question(name).send(cfg.DNS_IP, 53, timeout=1))
    return reply.header.rcode == 0 and bool(reply.rr)


def _node_ready(api_client) -> bool:
    from kubernetes import client
    node = client.CoreV1Api(api_client).read_node(cfg.NODE_NAME)
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])


def up(state_dir: Path, *, image_names=DEFAULT_IMAGES, die_with_parent: bool = False, timeout: float = 180) -> Node:
    """Start the node (building what is missing first); on failure, stop whatever started and raise."""
    build = subprocess.run(["bash", str(HACK / "k8s-build.sh"), "all"], stdout=2)
    if build.returncode != 0:
        raise cluster.ClusterError("hack/k8s-build.sh all failed")
    bins = cluster.bin_dir()
    built = images_mod.build(["pause", *[n for n in image_names if n != "pause"]], cache=images_mod.cache_dir(),
                             bin_dir=bins, log=_say)
    built = {n: built[n] for n in ["pause", *image_names] if n in built}
    down(state_dir, quiet=True)
    node = Node(state_dir=state_dir, images={n: i.ref for n, i in built.items()})
    paths = node.paths
    shutil.rmtree(paths.run, ignore_errors=True)
    for d in (paths.run, paths.images, paths.cni_conf_dir, paths.cni_ipam_dir, paths.kubelet_root, paths.pki):
        d.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        _start(node, built, bins, die_with_parent, timeout)
    except BaseException:
        _say(f"start failed; stopping what started (logs stay in {paths.run})")
        _stop(node)
        raise
    node.save()
    _say(f"node up in {time.monotonic() - t0:.0f}s: API {node.host}, pods on {cfg.BRIDGE} {cfg.POD_CIDR}, "
         f"DNS {cfg.DNS_IP}; logs in {paths.run}")
    return node


def _start(node: Node, built: dict, bins: Path, die_with_parent: bool, timeout: float) -> None:
    import datetime as dt

    from trainhook.certs.build import build_ca
    paths = node.paths
    host.save_sysctls(cfg.SYSCTLS_SAVED, node.state_dir / "sysctls.json")
    host.write_sysctls(cfg.SYSCTLS_SET)
    host.ensure_bridge(cfg.BRIDGE, f"{cfg.host_ip()}/{cfg.POD_CIDR.split('/')[1]}")
    host.add_rules(cfg.firewall_rules())
    host.ensure_cgroup(cfg.CGROUP_ROOT)

    paths.resolv_conf.write_text(cfg.pods_resolv_conf())
    (paths.cni_conf_dir / "10-trainhook.conflist").write_text(json.dumps(cfg.cni_conflist(paths), indent=1))
    paths.containerd_config.write_text(cfg.containerd_toml(paths, built["pause"].ref))
    _start_containerd(node, die_with_parent)
    if host.remove_containers(paths):  # left by a crash: CRI must not remember them, so restart it clean
        processes.stop_pid(node.pids.pop("containerd"), str(paths.run))
        node.procs.pop("containerd")
        _start_containerd(node, die_with_parent)
    _import_images(node, built)

    ca = build_ca("trainhook-k8s-ca", dt.datetime.now(dt.timezone.utc))
    certs = cluster_certs.write_node_files(ca, paths.pki, cfg.NODE_NAME, cfg.host_ip())
    address = cfg.host_ip()
    cp = cluster.start(paths.run / "control-plane", scheduler=True, timeout=timeout, die_with_parent=die_with_parent,
                       bins=bins, address=address, ca=ca, extra_apiserver_args=[
                           "--kubelet-client-certificate", str(certs["apiserver-kubelet-client.crt"]),
                           "--kubelet-client-key", str(certs["apiserver-kubelet-client.key"]),
                           "--kubelet-preferred-address-types", "InternalIP",
                           "--enable-aggregator-routing=true"])
    node.kubeconfig, node.host = str(cp.kubeconfig), cp.host
    node.save()
    api = cp.api_client()
    _create_dns_service(api)
    _spawn(node, "cluster-dns", [sys.executable, str(HACK / "cluster_dns.py"), "--kubeconfig", str(cp.kubeconfig),
                                 "--listen", f"{address}:53", "--domain", cfg.CLUSTER_DOMAIN], die_with_parent)

    kubelet_kc = cluster_certs.write_client_kubeconfig(paths.run / "kubelet.kubeconfig", cp.host, ca, paths.pki,
                                                       "kubelet-client", f"system:node:{cfg.NODE_NAME}")
    proxy_kc = cluster_certs.write_client_kubeconfig(paths.run / "kube-proxy.kubeconfig", cp.host, ca, paths.pki,
                                                     "kube-proxy", "system:kube-proxy")
    kubelet_json = paths.run / "kubelet.json"
    kubelet_json.write_text(json.dumps(cfg.kubelet_config(paths, ca_file=certs["ca.crt"],
                                                          healthz_port=processes.free_port()), indent=1))
    proxy_json = paths.run / "kube-proxy.json"
    proxy_json.write_text(json.dumps(cfg.kube_proxy_config(proxy_kc, healthz_port=processes.free_port(),
                                                           metrics_port=processes.free_port()), indent=1))
    _spawn(node, "kubelet", cfg.kubelet_args(bins, paths, kubeconfig=kubelet_kc, config=kubelet_json),
           die_with_parent)
    _spawn(node, "kube-proxy", [str(bins / "kube-proxy"), "--config", str(proxy_json), "--v", "1"], die_with_parent)

    _wait(node, f"node {cfg.NODE_NAME} Ready", lambda: _node_ready(api), timeout, "kubelet")
    _wait(node, "the cluster DNS answering through the kube-dns Service",
          lambda: _dns_answers(f"kubernetes.default.svc.{cfg.CLUSTER_DOMAIN}"), 60, "cluster-dns")
    _wait(node, "kube-proxy's rules for the kubernetes Service",
          lambda: _tcp_connects(cfg.service_ip(1), 443), 60, "kube-proxy")
    api.close()


def _tcp_connects(ip: str, port: int) -> bool:
    with socket.create_connection((ip, port), timeout=1):
        return True


# ---- stop --------------------------------------------------------------------------------------------------------

def _stop(node: Node) -> None:
    """Everything `up` started or changed, in reverse, each step tolerant of a previous partial stop."""
    paths, marker = node.paths, str(node.paths.run)
    for name in ("kube-proxy", "kubelet", "cluster-dns"):
        if name in node.pids:
            processes.stop_pid(node.pids[name], marker)
    if node.alive("containerd"):
        host.remove_containers(paths)
        processes.stop_pid(node.pids["containerd"], marker)
    host.stop_shims(paths.containerd_socket, processes.stop_pid)
    killed = host.kill_cgroup(cfg.CGROUP_ROOT)
    if killed:
        _say(f"killed {killed} leftover pod processes in cgroup {cfg.CGROUP_ROOT}")
    cp = cluster.ControlPlane.load(paths.run / "control-plane")
    if cp:
        cp.stop()
    host.unmount_under(paths.run)
    host.delete_kube_chains()  # the kubelet's and kube-proxy's iptables chains (they leave them when stopped)
    host.delete_rules(cfg.firewall_rules())
    host.delete_bridge(cfg.BRIDGE)
    host.restore_sysctls(node.state_dir / "sysctls.json")
    node.pids.clear()
    (paths.run / NODE_FILE).unlink(missing_ok=True)


def ensure_up(state_dir: Path, **kw) -> tuple[Node, bool]:
    """The running node in `state_dir`, or a new one: (node, whether this call started it). Locked."""
    with _locked(state_dir):
        existing = Node.load(state_dir)
        if existing and existing.running():
            return existing, False
        return up(state_dir, **kw), True


def ensure_down(state_dir: Path) -> None:
    with _locked(state_dir):
        down(state_dir)


def down(state_dir: Path, quiet: bool = False) -> None:
    node = Node.load(state_dir) or Node(state_dir=state_dir)
    t0 = time.monotonic()
    _stop(node)
    if not quiet:
        _say(f"node in {state_dir} stopped in {time.monotonic() - t0:.1f}s")


# ---- CLI ---------------------------------------------------------------------------------------------------------

def _export_lines(node: Node) -> str:
    return "\n".join(f"export {k}={v}" for k, v in node.env().items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("up", "down", "env"):
        p = sub.add_parser(name)
        p.add_argument("--state-dir", default=str(default_state_dir()), help="default: %(default)s")
        if name == "up":
            p.add_argument("--images", default=",".join(DEFAULT_IMAGES), help="default: %(default)s")
            p.add_argument("--timeout", type=float, default=180.0)
    args = parser.parse_args(argv)
    state_dir = Path(args.state_dir).resolve()
    if args.command in ("up", "down") and os.geteuid() != 0:
        print("node: root is needed (bridge, iptables, cgroups, mounts)", file=sys.stderr)
        return 1
    try:
        with _locked(state_dir):
            if args.command == "env":
                node = Node.load(state_dir)
                if node is None or not node.running():
                    print("node: none running; `python hack/node.py up`", file=sys.stderr)
                    return 1
                print(_export_lines(node))
            elif args.command == "down":
                down(state_dir)
            else:
                existing = Node.load(state_dir)
                if existing and existing.running():
                    _say(f"already running at {existing.host}")
                else:
                    existing = up(state_dir, image_names=[n for n in args.images.split(",") if n],
                                  timeout=args.timeout)
                print(_export_lines(existing))
    except (cluster.ClusterError, images_mod.ImageError, subprocess.CalledProcessError) as e:
        print(f"node: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
