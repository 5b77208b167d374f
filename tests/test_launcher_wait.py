"""`trainhook-launch wait`: the gang-wait init container, against real name resolution and real sockets.

Each "pod" is a launcher process with a private /etc/hosts (bind-mounted in its own mount namespace) that
gives every member's address. For `tcp`, each pod also gets its own network namespace with one IP on a shared
bridge, exactly like pods on a cluster network, so every wait listens on the same port on all interfaces.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainhook import keys
from trainhook.launcher.gang import Gang, parse_gang
from trainhook.launcher.wait import Barrier, answer

LAUNCH = [sys.executable, "-m", "trainhook.launcher.cli"]
ADDRESSES = ["job-master-0.job", "job-worker-0.job", "job-worker-1.job"]  # ranks 0, 1, 2
ROLES = [("master", 0), ("worker", 0), ("worker", 1)]
BIND_HOSTS = 'mount --bind "$0" /etc/hosts && exec "$@"'
_names = itertools.count()


def pod_env(rank: int, job: str = "job", **extra: str) -> dict[str, str]:
    """The variables the webhook injects into the gang-wait container of member `rank` of master=1,worker=2."""
    role, index = ROLES[rank]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINHOOK_")}
    env.update({
        keys.TH_FRAMEWORK: "pytorch", keys.TH_JOB_NAME: job, keys.TH_NAMESPACE: "ns", keys.TH_ROLE: role,
        keys.TH_INDEX: str(index), keys.TH_RANK: str(rank), keys.TH_REPLICAS: "master=1,worker=2",
        keys.TH_HOSTS: "master=job-master,worker=job-worker", keys.TH_SUBDOMAIN: "job",
        keys.TH_ADDRESS: ADDRESSES[rank],
    })
    env.update(extra)
    return env


def hosts_file(tmp_path: Path, ips: dict[str, str]) -> Path:
    path = tmp_path / "hosts"
    path.write_text("127.0.0.1 localhost\n" + "".join(f"{ip} {name}\n" for name, ip in ips.items()))
    return path


def finish(proc: subprocess.Popen[str], timeout: float = 20) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


# --- dns ------------------------------------------------------------------------------------------------------

def wait_dns(hosts: Path, rank: int, timeout: float) -> subprocess.Popen[str]:
    """A dns wait with only `hosts` to resolve from: a fresh network namespace has no DNS server to ask."""
    cmd = ["unshare", "--net", "--mount", "--", "sh", "-c", BIND_HOSTS, str(hosts),
           *LAUNCH, "wait", "--mode", "dns", "--timeout", str(timeout)]
    return subprocess.Popen(cmd, env=pod_env(rank), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_dns_wait_finishes_when_every_address_resolves(tmp_path):
    hosts = hosts_file(tmp_path, {a: f"10.0.0.{i + 1}" for i, a in enumerate(ADDRESSES)})
    code, out, err = finish(wait_dns(hosts, 1, timeout=10))
    assert code == 0, err
    assert "3/3 peers resolve" in out and "all peers are there" in out


def test_dns_wait_keeps_polling_until_a_late_address_appears(tmp_path):
    hosts = hosts_file(tmp_path, {a: f"10.0.0.{i + 1}" for i, a in enumerate(ADDRESSES[:2])})
    proc = wait_dns(hosts, 0, timeout=15)
    time.sleep(1.5)
    with open(hosts, "a") as f:  # in place: the bind mount shows this inode's content
        f.write(f"10.0.0.3 {ADDRESSES[2]}\n")
    code, out, err = finish(proc)
    assert code == 0, err
    assert f"2/3 peers resolve; waiting for rank 2 (worker-1 at {ADDRESSES[2]})" in out
    assert "3/3 peers resolve" in out


def test_dns_wait_gives_up_at_the_deadline_naming_the_missing_peer(tmp_path):
    hosts = hosts_file(tmp_path, {a: f"10.0.0.{i + 1}" for i, a in enumerate(ADDRESSES[:2])})
    started = time.monotonic()
    code, _, err = finish(wait_dns(hosts, 0, timeout=2))
    assert code == 1
    assert time.monotonic() - started < 10
    assert f"1 of 3 members missing: rank 2 (worker-1 at {ADDRESSES[2]}): its address does not resolve" in err
    assert ADDRESSES[0] not in err and ADDRESSES[1] not in err


# --- tcp ------------------------------------------------------------------------------------------------------

class PodNetwork:
    """Network namespaces joined by a bridge: pod i has IP 10.213.0.(i+1) and its own port space."""

    def __init__(self, size: int):
        tag = f"th{os.getpid()}x{next(_names)}"
        self.bridge, self.pods = f"{tag}b", [f"{tag}p{i}" for i in range(size)]
        self.ips = [f"10.213.0.{i + 1}" for i in range(size)]
        self.procs: list[subprocess.Popen[str]] = []

    def __enter__(self) -> "PodNetwork":
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
        cmd = ["ip", "netns", "exec", self.pods[i], "unshare", "--mount", "--", "sh", "-c", BIND_HOSTS,
               str(hosts), *args]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(proc)
        return proc

    def wait_tcp(self, rank: int, hosts: Path, timeout: float) -> subprocess.Popen[str]:
        return self.start(rank, hosts, [*LAUNCH, "wait", "--timeout", str(timeout)],
                          pod_env(rank, **{keys.TH_GANG_WAIT: "tcp"}))


@pytest.fixture
def network(tmp_path):
    with PodNetwork(3) as net:
        net.hosts = hosts_file(tmp_path, dict(zip(ADDRESSES, net.ips)))  # type: ignore[attr-defined]
        yield net


def test_tcp_wait_finishes_for_every_member_of_a_whole_gang(network):
    procs = [network.wait_tcp(rank, network.hosts, timeout=15) for rank in range(3)]
    for rank, proc in enumerate(procs):
        code, out, err = finish(proc)
        assert code == 0, err
        assert f"listening on port {keys.GANG_WAIT_PORT} as rank {rank}" in out
        assert "2/2 peers reached both ways" in out and "all peers are there" in out


def test_tcp_wait_finishes_when_members_start_at_different_times(network):
    procs = []
    for rank in (2, 0, 1):
        procs.append(network.wait_tcp(rank, network.hosts, timeout=20))
        time.sleep(1.5)
    results = [finish(proc) for proc in procs]
    assert [code for code, _, _ in results] == [0, 0, 0], [err for _, _, err in results]
    assert "waiting for" in results[0][1]  # the first one really did wait for the others


def test_tcp_wait_without_one_member_fails_naming_it(network):
    started = time.monotonic()
    procs = [network.wait_tcp(rank, network.hosts, timeout=3) for rank in (0, 1)]
    for proc in procs:
        code, _, err = finish(proc)
        assert code == 1
        assert (f"1 of 3 members missing: rank 2 (worker-1 at {ADDRESSES[2]}): cannot reach it: "
                f"connection refused; it has not reached us") in err
        assert ADDRESSES[0] not in err and ADDRESSES[1] not in err
    assert time.monotonic() - started < 12


HELLO = """
import socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), 5) as conn:
    conn.sendall(sys.argv[3].encode() + b"\\n")
    print(conn.makefile().readline().strip(), flush=True)
"""


def test_tcp_wait_refuses_a_connection_from_another_gang(network, tmp_path):
    """A stray hello (another gang's pod at a recycled address) is answered `no` and does not count."""
    two = hosts_file(tmp_path, dict(zip(ADDRESSES, network.ips)))
    env = lambda rank: pod_env(rank, **{keys.TH_GANG_WAIT: "tcp", keys.TH_REPLICAS: "master=1,worker=1"})  # noqa: E731
    master = network.start(0, two, [*LAUNCH, "wait", "--timeout", "20"], env(0))
    time.sleep(1.0)
    for line in ("trainhook-gang/1 ns other-job 1", "trainhook-gang/1 other-ns job 1", "GET / HTTP/1.0"):
        stray = subprocess.run(["ip", "netns", "exec", network.pods[1], sys.executable, "-c", HELLO,
                                network.ips[0], str(keys.GANG_WAIT_PORT), line],
                               capture_output=True, text=True, timeout=20)
        assert stray.stdout.startswith("no "), stray.stderr
    time.sleep(0.5)
    assert master.poll() is None  # still waiting: the strays did not count
    worker = network.start(1, two, [*LAUNCH, "wait", "--timeout", "20"], env(1))
    for proc in (master, worker):
        code, out, err = finish(proc)
        assert code == 0, err
        assert "1/1 peers reached both ways" in out


# --- the barrier's rules, as pure functions ---------------------------------------------------------------------

def tcp_gang() -> Gang:
    return parse_gang(pod_env(0, **{keys.TH_GANG_WAIT: "tcp"}))


@pytest.mark.parametrize("line, rank", [
    ("trainhook-gang/1 ns job 2", 2),
    ("trainhook-gang/1 ns job 0", None),  # ourselves: a misrouted address, not a peer
    ("trainhook-gang/1 ns job 3", None),  # no such rank in this gang
    ("trainhook-gang/1 ns other 1", None),
    ("trainhook-gang/2 ns job 1", None),
    ("", None),
])
def test_a_hello_counts_only_from_a_peer_of_the_same_gang(line, rank):
    got, reply = answer(tcp_gang(), line)
    assert got == rank
    if rank is None:
        assert reply.startswith("no ")
    else:
        assert reply == "ok 0"  # our own rank, which the peer checks against the address it dialled


def test_a_member_is_done_only_when_reached_both_ways():
    """Stopping after reaching everyone is not enough: a peer that has not reached us yet still needs us."""
    barrier = Barrier(tcp_gang())
    barrier.reached.update({1, 2})
    barrier.reached_us.add(1)
    assert [p.rank for p in barrier.missing()] == [2]
    barrier.reached_us.add(2)
    assert barrier.missing() == []
