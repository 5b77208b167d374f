"""Pods on a real network for the launcher's tests: network namespaces joined by a bridge, each with its own address
and port space, as a CNI bridge gives pods (no faked networking). Pod i has the address `<subnet>.(i+1)`; a
process started in it sees `hosts` as its /etc/hosts (its own mount namespace), as a pod sees the kubelet's.

Adds network namespaces with `ip netns`: never while the real node has pods (docs/develop/control-plane.md).
"""

from __future__ import annotations

import itertools
import os
import subprocess
from pathlib import Path

BIND_HOSTS = 'mount --bind "$0" /etc/hosts && exec "$@"'
_names = itertools.count()


class PodNetwork:
    """`size` pods on one bridge, in a `with` block; the processes started in them are killed at its end."""

    def __init__(self, size: int, subnet: str = "10.213.0", tag: str = "th"):
        tag = f"{tag}{os.getpid()}x{next(_names)}"
        self.bridge, self.pods = f"{tag}b", [f"{tag}p{i}" for i in range(size)]
        self.ips = [f"{subnet}.{i + 1}" for i in range(size)]
        self.procs: list[subprocess.Popen[str]] = []

    def __enter__(self) -> PodNetwork:
        ip = lambda *args: subprocess.run(["ip", *args], check=True, capture_output=True)  # noqa: E731
        ip("netns", "add", self.bridge)
        ip("-n", self.bridge, "link", "add", "br0", "type", "bridge")
        ip("-n", self.bridge, "link", "set", "br0", "up")
        for i, (pod, addr) in enumerate(zip(self.pods, self.ips)):
            ip("netns", "add", pod)
            ip("-n", self.bridge, "link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0", "netns", pod)
            ip("-n", self.bridge, "link", "set", f"v{i}", "master", "br0", "up")
            ip("-n", pod, "addr", "add", f"{addr}/24", "dev", "eth0")
            ip("-n", pod, "link", "set", "eth0", "up")
            ip("-n", pod, "link", "set", "lo", "up")
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for ns in [*self.pods, self.bridge]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def start(self, i: int, hosts: Path, args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
        """`args` in pod i, with `hosts` as its /etc/hosts."""
        cmd = ["ip", "netns", "exec", self.pods[i], "unshare", "--mount", "--", "sh", "-c", BIND_HOSTS,
               str(hosts), *args]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(proc)
        return proc
