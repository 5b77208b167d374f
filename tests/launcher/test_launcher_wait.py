"""`trainhook-launch wait`: the gang-wait init container, against real name resolution and real sockets.

Each "pod" is a launcher process with a private /etc/hosts (bind-mounted in its own mount namespace) that
gives every member's address. For `tcp`, each pod also gets its own network namespace with one IP on a shared
bridge, exactly like pods on a cluster network, so every wait listens on the same port on all interfaces.
"""

from __future__ import annotations

import re
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import pod_network
from pod_network import BIND_HOSTS
from trainhook.gang import keys
from trainhook.launcher.pod_view import GangView, parse_gang
from trainhook.launcher import reach
from trainhook.launcher.wait import command as wait_module
from trainhook.launcher.wait import dns as dns_mode
from trainhook.launcher.wait.tcp_lines import PROTOCOL, missing_line, parse_hello, parse_missing

LAUNCH = [sys.executable, "-m", "trainhook.launcher.cli"]
ADDRESSES = ["job-master-0.job", "job-worker-0.job", "job-worker-1.job"]  # ranks 0, 1, 2
ROLES = [("master", 0), ("worker", 0), ("worker", 1)]


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


def gang_hosts(tmp_path: Path, ranks: list[int]) -> Path:
    """What cluster DNS answers once members `ranks` exist: each one's name, and the headless Service `job` with
    one address per member (one line per address: glibc's files backend returns them all)."""
    path = tmp_path / "hosts"
    lines = ["127.0.0.1 localhost"] + [f"10.0.0.{r + 1} {ADDRESSES[r]}" for r in ranks]
    path.write_text("\n".join(lines + [f"10.0.0.{r + 1} job" for r in ranks]) + "\n")
    return path


def test_rank_0s_dns_wait_finishes_when_every_member_resolves(tmp_path):
    code, out, err = finish(wait_dns(gang_hosts(tmp_path, [0, 1, 2]), 0, timeout=10))
    assert code == 0, err
    assert "waiting up to 10s for all 3 members" in out
    assert "every member's address resolves (3/3)" in out and "all peers are there" in out


def test_a_member_waits_only_for_its_own_address_and_rank_0s(tmp_path):
    """Rank 1 of master=1,worker=2 is done while rank 2 does not exist: rank 0's wait (and the launcher's
    barrier) waits for it, not every member (issue 26: that was O(N^2) queries)."""
    code, out, err = finish(wait_dns(gang_hosts(tmp_path, [0, 1]), 1, timeout=10))
    assert code == 0, err
    assert "for this pod's own address and rank 0's (job-master-0.job); rank 0 waits for the rest" in out
    assert "2/2 of this pod's own and rank 0's addresses resolve" in out


def test_a_member_gives_up_naming_rank_0_when_rank_0_does_not_resolve(tmp_path):
    code, _, err = finish(wait_dns(gang_hosts(tmp_path, [1, 2]), 2, timeout=2))
    assert code == 1
    assert f"1 of 3 members missing: rank 0 (master-0 at {ADDRESSES[0]}): its address does not resolve" in err


def test_rank_0s_dns_wait_keeps_polling_until_a_late_member_appears(tmp_path):
    hosts = gang_hosts(tmp_path, [0, 1])
    proc = wait_dns(hosts, 0, timeout=15)
    time.sleep(1.5)
    with open(hosts, "a") as f:  # in place: the bind mount shows this inode's content
        f.write(f"10.0.0.3 {ADDRESSES[2]}\n10.0.0.3 job\n")
    code, out, err = finish(proc)
    assert code == 0, err
    assert "2/3 members' addresses resolve (as the Service job lists them)" in out  # one query a poll
    assert "every member's address resolves (3/3)" in out


def test_rank_0s_dns_wait_gives_up_at_the_deadline_naming_the_missing_member(tmp_path):
    started = time.monotonic()
    code, _, err = finish(wait_dns(gang_hosts(tmp_path, [0, 1]), 0, timeout=2))
    assert code == 1
    assert time.monotonic() - started < 10
    assert f"1 of 3 members missing: rank 2 (worker-1 at {ADDRESSES[2]}): its address does not resolve" in err
    assert ADDRESSES[0] not in err and ADDRESSES[1] not in err


def test_rank_0s_queries_per_poll_do_not_grow_with_the_gang(monkeypatch):
    """A 64-member gang whose members appear one per poll: rank 0 asks for the Service once per poll and
    resolves each member's own name about once, O(N) lookups in all, never N per poll (real time, real
    threads; the lookups are the functions the wait is given)."""
    env = pod_env(0, **{keys.TH_REPLICAS: "master=1,worker=63"})
    gang = parse_gang(env)
    monkeypatch.setattr(reach, "FIRST_DELAY", 0.001)
    monkeypatch.setattr(dns_mode, "GATHER_FLOOR", 0.002)
    present, asked, polls = [1], [], []

    def count(name):
        polls.append(name)
        present[0] = min(gang.size, present[0] + 1)  # one more member exists at each poll
        return {f"10.0.{i // 250}.{i % 250}" for i in range(present[0])}

    def resolve(address):
        asked.append(address)
        return int(address.split("-")[-1].split(".")[0]) < present[0] - 1 or address.startswith("job-master")

    missing = dns_mode.wait_gathering(gang, time.monotonic() + 20, resolve=resolve, count=count)
    assert missing == []
    assert set(polls) == {"job"} and len(polls) >= 63
    assert len(asked) <= 2 * gang.size, len(asked)  # each name about once, not once per poll (that was 64 x 63)


def test_the_backoff_grows_to_a_floor_then_to_a_share_of_the_time_waited():
    now = [0.0]
    backoff = wait_module.Backoff(0.5, clock=lambda: now[0], draw=lambda: 1.0)
    delays = [backoff.next() for _ in range(8)]
    assert delays[0] == pytest.approx(0.1) and delays[1] == pytest.approx(0.15)
    assert max(delays) == pytest.approx(0.5)  # the floor, while the wait is young
    now[0] = 40.0
    assert backoff.next() == pytest.approx(0.75)  # growing again: the cap is 5% of 40 s, 2 s
    now[0] = 1000.0
    assert max(backoff.next() for _ in range(20)) == pytest.approx(5.0)  # never beyond MAX_DELAY
    low = wait_module.Backoff(0.5, clock=lambda: 0.0, draw=lambda: 0.0)
    assert low.next() == pytest.approx(0.05)  # jittered down to half the delay, never more


# --- tcp ------------------------------------------------------------------------------------------------------

class PodNetwork(pod_network.PodNetwork):
    """The launcher's tcp wait in pods on one bridge (tests/support/pod_network.py): pod i has IP 10.213.0.(i+1)."""

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
    results = [finish(proc) for proc in procs]
    for code, out, err in results:
        assert code == 0, err
        assert "all peers are there" in out
    assert f"listening on port {keys.GANG_WAIT_PORT} as rank 0" in results[0][1]  # only rank 0 listens
    assert "2/2 members reached rank 0's gang wait" in results[0][1]
    for _, out, _ in results[1:]:
        assert f"reached rank 0's gang wait (rank 0 (master-0 at {ADDRESSES[0]}))" in out


def test_tcp_wait_finishes_when_members_start_at_different_times(network):
    procs = []
    for rank in (2, 0, 1):
        procs.append(network.wait_tcp(rank, network.hosts, timeout=20))
        time.sleep(1.5)
    results = [finish(proc) for proc in procs]
    assert [code for code, _, _ in results] == [0, 0, 0], [err for _, _, err in results]
    # the first one really did wait: it reached rank 0 and heard who was missing
    assert f"rank 0 waits for 1 member(s): rank 1 (worker-0 at {ADDRESSES[1]})" in results[0][1]


def test_tcp_wait_without_one_member_fails_naming_it_at_rank_0_and_at_the_members(network):
    started = time.monotonic()
    procs = [network.wait_tcp(rank, network.hosts, timeout=3) for rank in (0, 1)]
    (code0, _, err0), (code1, _, err1) = finish(procs[0]), finish(procs[1])
    assert (code0, code1) == (1, 1)
    missing = f"rank 2 (worker-1 at {ADDRESSES[2]}): it has not reached rank 0's gang wait"
    assert f"1 of 3 members missing (as rank 0 last reported): {missing}" in err1  # learned from rank 0
    # Rank 0 names rank 2 first; rank 1, whose own deadline came a moment before rank 0's, may be named too,
    # as having left, never as not having come.
    assert re.search(rf"[12] of 3 members missing: {re.escape(missing)}(; rank 1 \(worker-0 at "
                     rf"{re.escape(ADDRESSES[1])}\): it reached rank 0's gang wait, then left \(its own deadline, "
                     rf"or its pod restarted\))?\n$", err0), err0
    assert ADDRESSES[0] not in err0 and ADDRESSES[0] not in err1 and ADDRESSES[1] not in err1
    assert time.monotonic() - started < 12


def test_a_tcp_member_without_rank_0_fails_naming_rank_0(network):
    code, _, err = finish(network.wait_tcp(1, network.hosts, timeout=2))
    assert code == 1
    assert f"1 of 3 members missing: rank 0 (master-0 at {ADDRESSES[0]}): cannot reach it: connection refused" in err


HELLO = """
import socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), 5) as conn:
    conn.sendall(sys.argv[3].encode() + b"\\n")
    print(conn.makefile().readline().strip(), flush=True)
"""


def test_tcp_wait_refuses_a_connection_from_another_gang(network, tmp_path):
    """A stray hello (another gang's pod at a recycled address, an older launcher) is answered `no` and does not
    count."""
    two = hosts_file(tmp_path, dict(zip(ADDRESSES, network.ips)))
    env = lambda rank: pod_env(rank, **{keys.TH_GANG_WAIT: "tcp", keys.TH_REPLICAS: "master=1,worker=1"})  # noqa: E731
    master = network.start(0, two, [*LAUNCH, "wait", "--timeout", "20"], env(0))
    time.sleep(1.0)
    for line in (f"{PROTOCOL} ns other-job 1 {NONCE}", f"{PROTOCOL} other-ns job 1 {NONCE}",
                 "trainhook-gang/2 ns job 1", "trainhook-gang/1 ns job 1", "GET / HTTP/1.0"):
        stray = subprocess.run(["ip", "netns", "exec", network.pods[1], sys.executable, "-c", HELLO,
                                network.ips[0], str(keys.GANG_WAIT_PORT), line],
                               capture_output=True, text=True, timeout=20)
        assert stray.stdout.startswith("no "), stray.stderr
    time.sleep(0.5)
    assert master.poll() is None  # still waiting: the strays did not count
    worker = network.start(1, two, [*LAUNCH, "wait", "--timeout", "20"], env(1))
    results = [finish(proc) for proc in (master, worker)]
    assert [code for code, _, _ in results] == [0, 0], [err for _, _, err in results]
    assert "0/1 members reached rank 0's gang wait" in results[0][1]
    assert "1/1 members reached rank 0's gang wait" in results[0][1]


# --- the barrier's rules, as pure functions ---------------------------------------------------------------------

def tcp_gang() -> GangView:
    return parse_gang(pod_env(0, **{keys.TH_GANG_WAIT: "tcp"}))


NONCE = "0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize("line, rank", [
    (f"{PROTOCOL} ns job 2 {NONCE}", 2),
    (f"{PROTOCOL} ns job 0 {NONCE}", None),  # ourselves: a misrouted address, not a peer
    (f"{PROTOCOL} ns job 3 {NONCE}", None),  # no such rank in this gang
    (f"{PROTOCOL} ns other 1 {NONCE}", None),
    (f"{PROTOCOL} ns job 1", None),  # no nonce: a hello of /2, which counted without any proof (issue 31)
    ("trainhook-gang/2 ns job 1", None),
    ("trainhook-gang/1 ns job 1", None),  # the all-to-all barrier's hello: an older launcher
    ("", None),
])
def test_a_hello_names_a_member_only_of_the_same_gang(line, rank):
    got = parse_hello(tcp_gang(), line)
    if rank is None:
        assert isinstance(got, str) and got.startswith("no ")
    else:
        assert got == (rank, NONCE)  # then the member proves it is rank `rank` (the key, or its address)


def test_what_rank_0_tells_its_members_about_the_missing_ones_round_trips():
    assert parse_missing(missing_line([2, 5]).decode().strip()) == (2, [2, 5])
    assert parse_missing(missing_line([]).decode().strip()) == (0, [])
    many = missing_line(list(range(1, 101))).decode().strip()
    assert parse_missing(many) == (100, list(range(1, 9)))  # the first 8 named, all 100 counted
    assert len(many) < 100
    assert parse_missing("go") is None


def test_names_are_made_absolute_with_the_pods_own_search_domain(tmp_path):
    """A pod's resolv.conf (kubelet, ClusterFirst) starts its search list with <namespace>.svc.<zone>: the wait asks
    for absolute names, one pair of queries per lookup instead of one per search domain."""
    conf = tmp_path / "resolv.conf"
    conf.write_text("search ml.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.0.0.10\n"
                    "options ndots:5\n")
    domain = wait_module.search_domain("ml", str(conf))
    assert domain == "ml.svc.cluster.local"
    assert wait_module.qualified("job-worker-0.job", domain) == "job-worker-0.job.ml.svc.cluster.local."
    assert wait_module.search_domain("other", str(conf)) is None  # not this namespace's: names stay as they are
    assert wait_module.qualified("job-worker-0.job", None) == "job-worker-0.job"
    assert wait_module.search_domain("ml", str(tmp_path / "missing")) is None


def test_the_init_containers_dns_wait_and_install_import_no_tls_no_dataclasses_no_typing(tmp_path):
    """Every pod of the init-container path runs this command before its training can start (issue 32: on one
    node they start together). A dns wait never calls the notary, so it does not load ssl (~7 ms; only the tcp
    barrier asks for the gang's key), and it imports no dataclasses (with inspect, ast, dis, tokenize: ~10 ms),
    typing or secrets. Run as the launcher image runs it, installing into a directory first; without
    site (-S, the checkout on PYTHONPATH), whose .pth hooks in this virtualenv import modules of their own."""
    hosts = gang_hosts(tmp_path, [0, 1, 2])
    cmd = ["unshare", "--net", "--mount", "--", "sh", "-c", BIND_HOSTS, str(hosts), sys.executable, "-S", "-X",
           "importtime", *LAUNCH[1:], "wait", "--install", str(tmp_path / "trainhook"), "--mode", "dns",
           "--timeout", "10"]
    env = {**pod_env(1), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    code, out, err = finish(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                             text=True))
    assert code == 0 and "all peers are there" in out, (out, err[-3000:])
    assert (tmp_path / "trainhook" / "launcher.pyz").is_file()  # the install ran in the same process
    imported = set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \| *(\S+)$", err, re.M))
    assert "trainhook.launcher.wait.dns" in imported
    # (random is left out: here, with no prebuilt entry program, install compiles and caches one with tempfile,
    # which imports it; the launcher image's is prebuilt.)
    heavy = {"ssl", "trainhook.launcher.notary_client", "dataclasses", "inspect", "typing", "secrets"}
    assert not heavy & imported, heavy & imported
