"""A private pod network on one machine: one network namespace per pod, all on one bridge, nothing routed out.

Layout of a run (id `abc123`):
  netns `th-abc123-sw`  the switch: bridge `br0`, and `v<i>`, the switch end of pod i's veth pair
  netns `th-abc123-<i>` pod i: `lo`, and `eth0` with address 10.244.<octet>.<i+2>/24, no default route
Addresses exist only inside the switch; no interface is created in the caller's namespace and no route leads
out, so pods reach each other and nothing else. The bridge itself has 10.244.<octet>.1 (`gateway`), where the
runner listens for the one service of its own that pods use: the notary's relay (`listen_on_switch`). Names carry
the run id, so parallel runs never collide.
`Network.close()` deletes everything it created and is safe to call twice; use the network as a context manager.
"""

from __future__ import annotations

import ctypes
import hashlib
import ipaddress
import os
import secrets
import shutil
import socket
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/run/netns")
NETNS_PREFIX = "th-"
MAX_PODS = 253  # .2 to .254 of the /24
REQUIRED_TOOLS = ("ip", "nsenter", "unshare")


class NetworkError(Exception):
    """The pod network cannot be built; the message says what is missing."""


def check_host() -> None:
    """Refuse early, with the reason, where network namespaces cannot be made."""
    if os.geteuid() != 0:
        raise NetworkError(
            "trainhook local needs root: it gives every pod its own network namespace, IP address and hostname, "
            "as a cluster does (no loopback-only mode is provided, because pods sharing one host's ports and "
            "hostname would not behave as they do in a cluster); run it with sudo, or use --dry-run")
    missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
    if missing:
        raise NetworkError(f"trainhook local needs {', '.join(missing)} on PATH (packages iproute2, util-linux)")


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {result.stderr.strip() or 'failed'}")


@dataclass(frozen=True)
class PodNet:
    """One pod's place on the network."""

    netns: str
    ip: str

    @property
    def netns_path(self) -> str:
        return str(NETNS_DIR / self.netns)


@dataclass
class Network:
    """The switch and the pods' namespaces of one run."""

    run_id: str = field(default_factory=lambda: secrets.token_hex(3))
    octet: int | None = None
    _created: list[str] = field(default_factory=list)  # netns names, in creation order
    _pods: int = 0

    def __post_init__(self) -> None:
        if self.octet is None:
            self.octet = int(self.run_id[:2], 16)
        self.subnet = ipaddress.ip_network(f"10.244.{self.octet}.0/24")
        self.switch = f"{NETNS_PREFIX}{self.run_id}-sw"

    def __enter__(self) -> Network:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _add_netns(self, name: str) -> None:
        _ip("netns", "add", name)
        self._created.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    @property
    def bridge_mac(self) -> str:
        """The bridge's own MAC address, fixed for the run (locally administered: 02, "th", 3 bytes of the run id's
        hash).
        Why fixed: a Linux bridge left to choose takes the lowest MAC among its ports, so a pod added later (a
        scale-up, a deleted pod created again) can change it; pods that cached the old one in their ARP tables
        then lose the gateway, and the notary behind it, until the entry expires (a coordinator's outcome went
        unrecorded that way: its connection timed out)."""
        return "02:74:68:" + ":".join(f"{b:02x}" for b in hashlib.sha256(self.run_id.encode()).digest()[:3])

    def open(self) -> None:
        """Create the switch namespace and its bridge."""
        check_host()
        self._add_netns(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "address", self.bridge_mac, "type", "bridge")
        _ip("-n", self.switch, "addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", "br0")
        _ip("-n", self.switch, "link", "set", "br0", "up")

    @property
    def gateway(self) -> str:
        """The bridge's own address (.1): pods reach the runner's listeners there, and nothing beyond."""
        return str(self.subnet.network_address + 1)

    def listen_on_switch(self, port: int) -> socket.socket:
        """A TCP socket listening on gateway:port inside the switch namespace, for this process to serve: a
        short-lived thread enters the namespace (setns acts on the calling thread only) and makes it there."""
        made: dict[str, object] = {}

        def make() -> None:
            try:
                fd = os.open(str(NETNS_DIR / self.switch), os.O_RDONLY)
                try:
                    if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
                        err = ctypes.get_errno()
                        raise OSError(err, f"setns into {self.switch}: {os.strerror(err)}")
                finally:
                    os.close(fd)
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((self.gateway, port))
                sock.listen(128)
                made["socket"] = sock
            except OSError as e:
                made["error"] = e

        thread = threading.Thread(target=make, name=f"netns-{self.switch}")
        thread.start()
        thread.join()
        if "error" in made:
            raise NetworkError(f"cannot listen on {self.gateway}:{port} in {self.switch}: {made['error']}")
        return made["socket"]  # type: ignore[return-value]

    def add_pod(self) -> PodNet:
        """A new pod namespace plugged into the switch, with the next free address."""
        if self._pods >= MAX_PODS:
            raise NetworkError(f"a local run holds at most {MAX_PODS} pods (one /24)")
        i = self._pods
        self._pods += 1
        netns = f"{NETNS_PREFIX}{self.run_id}-{i}"
        address = str(self.subnet.network_address + 2 + i)
        self._add_netns(netns)
        # Both ends are made inside the switch (names only need to be unique there), then one end moves.
        _ip("-n", self.switch, "link", "add", f"v{i}", "type", "veth", "peer", "name", f"p{i}")
        _ip("-n", self.switch, "link", "set", f"p{i}", "netns", netns)
        _ip("-n", netns, "link", "set", f"p{i}", "name", "eth0")
        _ip("-n", netns, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", "eth0")
        _ip("-n", netns, "link", "set", "eth0", "up")
        _ip("-n", self.switch, "link", "set", f"v{i}", "master", "br0")
        _ip("-n", self.switch, "link", "set", f"v{i}", "up")
        return PodNet(netns, address)

    def close(self) -> list[str]:
        """Delete every namespace this run created (pods first); returns the errors, if any, after trying all."""
        errors = []
        for name in reversed(self._created):
            result = subprocess.run(["ip", "netns", "del", name], capture_output=True, text=True)
            if result.returncode != 0 and (NETNS_DIR / name).exists():
                errors.append(f"ip netns del {name}: {result.stderr.strip()}")
        self._created.clear()
        return errors

    def namespaces(self) -> list[str]:
        return list(self._created)


def list_run_namespaces(run_id: str) -> list[str]:
    """The network namespaces of one run that still exist (for tests and leftover checks)."""
    prefix = f"{NETNS_PREFIX}{run_id}-"
    return sorted(p.name for p in NETNS_DIR.glob(f"{prefix}*")) if NETNS_DIR.is_dir() else []


# --- hosts files ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HostEntry:
    """One pod's DNS identity: what cluster DNS answers for it."""

    ip: str
    hostname: str
    subdomain: str
    namespace: str

    def names(self, cluster_domain: str) -> list[str]:
        """Every spelling a pod can resolve through cluster DNS plus its resolv.conf search domains."""
        if not self.subdomain:
            return [self.hostname]
        base = f"{self.hostname}.{self.subdomain}.{self.namespace}"
        return [f"{base}.svc.{cluster_domain}", f"{base}.svc", base, f"{self.hostname}.{self.subdomain}"]

    def fqdn(self, cluster_domain: str) -> str:
        return self.names(cluster_domain)[0]


def hosts_file(own: HostEntry, peers: list[HostEntry], cluster_domain: str = "cluster.local",
               services: dict[str, list[str]] | None = None) -> str:
    """The kubelet's managed hosts file for `own`, then entries for every pod of the run (and Services: name ->
    IPs, the headless ones' pods and the runner's notary relay), which cluster DNS would answer in a cluster."""
    lines = ["# Kubernetes-managed hosts file.", "127.0.0.1\tlocalhost",
             "::1\tlocalhost ip6-localhost ip6-loopback", "fe00::0\tip6-localnet", "fe00::0\tip6-mcastprefix",
             "fe00::1\tip6-allnodes", "fe00::2\tip6-allrouters"]
    if own.subdomain:
        lines.append(f"{own.ip}\t{own.fqdn(cluster_domain)}\t{own.hostname}")
    else:
        lines.append(f"{own.ip}\t{own.hostname}")
    lines.append("")
    lines.append("# Added by trainhook local: what cluster DNS answers for the pods and headless Services of the run.")
    for peer in peers:
        if peer.subdomain:
            lines.append(f"{peer.ip}\t" + " ".join(peer.names(cluster_domain)))
    for name, ips in sorted((services or {}).items()):
        for address in ips:
            lines.append(f"{address}\t{name}")
    return "\n".join(lines) + "\n"
