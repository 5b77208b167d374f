"""Issue 31 item 5: the tcp gang wait against forged hellos and a forged rank 0, with the real wait processes.

Before, rank 0 counted any line `trainhook-gang/2 NAMESPACE JOB RANK` (a non-member released rank 0's barrier)
and a member took any `ok 0` then `go` from whatever answered at rank 0's address. Now a member proves itself:
- with the gang's key, when the webhook named a notary in the wait's container (the real webhook's notary here,
  each pod presenting its own identity token): an HMAC over both ends' nonces, and rank 0 signs what it sends;
- by its address otherwise (no notary named: the gang-wait init container gets no identity token today): rank 0
  counts a hello only from the address the claimed member's name resolves to.

Pods are wait processes with their own /etc/hosts (a mount namespace each); the address-checked ones also have a
network namespace each on a shared bridge, as pods on a cluster network (their own address, their own ports).
"""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import pod_network
from pod_network import BIND_HOSTS
from gang_notary import GangNotary, indexed_job
from trainhook.gang import keys
from trainhook.launcher.pod_view import parse_gang
from webhook_process import free_port

LAUNCH = [sys.executable, "-m", "trainhook.launcher.cli"]
NONCE = "0123456789abcdef0123456789abcdef"


def finish(proc: subprocess.Popen[str], timeout: float = 40) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def say_hello(address: str, port: int, lines: list[str], netns: str | None = None) -> str:
    """What a forger gets back for `lines` sent on one connection (rank 0's answers, as one string)."""
    script = ("import socket, sys\nc = socket.create_connection((sys.argv[1], int(sys.argv[2])), 5)\n"
              "c.sendall(''.join(a + '\\n' for a in sys.argv[3:]).encode()); c.settimeout(3)\nout = b''\n"
              "try:\n    while True:\n        d = c.recv(4096)\n        if not d: break\n        out += d\n"
              "except OSError:\n    pass\nprint(out.decode().replace('\\n', '|'))\n")
    argv = [sys.executable, "-c", script, address, str(port), *lines]
    done = subprocess.run((["ip", "netns", "exec", netns] if netns else []) + argv, capture_output=True, text=True,
                          timeout=30)
    return done.stdout.strip()


# --- address-checked (no notary named in the wait's container) ----------------------------------------------------

class PodNetwork(pod_network.PodNetwork):
    """Pods on one bridge (tests/support/pod_network.py): pod i has IP 10.214.0.(i+1)."""

    def __init__(self, size: int):
        super().__init__(size, subnet="10.214.0", tag="ta")

    def wait(self, i: int, hosts: Path, env: dict[str, str], timeout: float) -> subprocess.Popen[str]:
        return self.start(i, hosts, [*LAUNCH, "wait", "--mode", "tcp", "--timeout", str(timeout)], env)


def pair_env(rank: int) -> dict[str, str]:
    """The gang-wait container of member `rank` of master=1,worker=1, as the webhook admits it (no notary)."""
    role = ("master", "worker")[rank]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINHOOK_")}
    env.update({keys.TH_FRAMEWORK: "pytorch", keys.TH_JOB_NAME: "job", keys.TH_NAMESPACE: "ns", keys.TH_ROLE: role,
                keys.TH_INDEX: "0", keys.TH_RANK: str(rank), keys.TH_REPLICAS: "master=1,worker=1",
                keys.TH_HOSTS: "master=job-master,worker=job-worker", keys.TH_SUBDOMAIN: "job",
                keys.TH_ADDRESS: ("job-master-0.job", "job-worker-0.job")[rank], keys.TH_GANG_WAIT: "tcp"})
    return env


def test_a_hello_from_a_non_member_does_not_release_rank_0(tmp_path):
    with PodNetwork(3) as net:  # pods 0 and 1 are the gang; pod 2 is someone else's, on the same network
        hosts = tmp_path / "hosts"
        hosts.write_text(f"127.0.0.1 localhost\n{net.ips[0]} job-master-0.job\n{net.ips[1]} job-worker-0.job\n")
        master = net.wait(0, hosts, pair_env(0), timeout=30)
        time.sleep(1.5)
        port = keys.GANG_WAIT_PORT
        for lines in (["trainhook-gang/2 ns job 1"], [f"trainhook-gang/3 ns job 1 {NONCE}"],
                      [f"trainhook-gang/3 ns job 1 {NONCE}", "proof 00"]):
            answer = say_hello(net.ips[0], port, lines, netns=net.pods[2])
            assert answer.startswith("no "), f"a non-member's hello {lines} was answered {answer!r}"
        time.sleep(0.5)
        assert master.poll() is None, "a non-member's hello released rank 0's barrier: " + master.communicate()[0]
        member = net.wait(1, hosts, pair_env(1), timeout=30)
        results = [finish(proc) for proc in (master, member)]
    assert [code for code, _, _ in results] == [0, 0], [err for _, _, err in results]
    assert "proves it is one by its address" in results[0][1]


# --- with the gang's key (a notary named in the wait's container) --------------------------------------------------

@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    """A 2-pod Indexed Job gang admitted by the real webhook, its notary serving; each pod's environment as the
    wait's (the notary's URL and CA, the pod's own token), with a free gang-wait port and a hosts file naming
    every member 127.0.0.1 (one network here: the key is the proof, not the address)."""
    root = tmp_path_factory.mktemp("wait-auth")
    with GangNotary(root / "run") as notary:
        pods = notary.admit(indexed_job("job", "ns", completions=2))
        port = free_port()
        envs = [{**notary.env(pod), keys.TH_GANG_WAIT: "tcp", keys.TH_GANG_WAIT_PORT: str(port)} for pod in pods]
        envs = [{**{k: v for k, v in os.environ.items() if not k.startswith("TRAINHOOK_")}, **env} for env in envs]
        hosts = root / "hosts"
        names = [peer.address for peer in parse_gang(envs[0]).peers]
        hosts.write_text("127.0.0.1 localhost\n" + "".join(f"127.0.0.1 {name}\n" for name in names))
        yield envs, hosts, port


def keyed_wait(env: dict[str, str], hosts: Path, timeout: float) -> subprocess.Popen[str]:
    cmd = ["unshare", "--mount", "--", "sh", "-c", BIND_HOSTS, str(hosts), *LAUNCH, "wait", "--mode", "tcp",
           "--timeout", str(timeout)]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_with_the_key_a_hello_without_the_gangs_proof_does_not_release_rank_0(keyed):
    envs, hosts, port = keyed
    master = keyed_wait(envs[0], hosts, timeout=30)
    try:
        time.sleep(1.5)
        for lines in (["trainhook-gang/2 ns job 1"], [f"trainhook-gang/3 ns job 1 {NONCE}", "proof " + "0" * 64],
                      [f"trainhook-gang/3 ns job 1 {NONCE}", "proof \u00e9"]):  # not ASCII: refused, no crash
            answer = say_hello("127.0.0.1", port, lines)
            assert "no " in answer and "go" not in answer.split("|"), f"{lines} was answered {answer!r}"
        time.sleep(0.5)
        assert master.poll() is None, "a hello without the key released rank 0's barrier"
        member = keyed_wait(envs[1], hosts, timeout=30)
        results = [finish(proc) for proc in (master, member)]
    finally:
        if master.poll() is None:
            master.kill()
    assert [code for code, _, _ in results] == [0, 0], [err for _, _, err in results]
    assert "proves it is one with the gang's key" in results[0][1]


class FakeRank0:
    """Answers at rank 0's port as the real one would, except that it holds no key: `ok`, then `go` unsigned
    (claiming the address mode) or signed with a made-up MAC, whatever protocol the member speaks."""

    def __init__(self, port: int):
        self.server = socket.create_server(("127.0.0.1", port))
        self.turn = itertools.count()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    hello = conn.recv(4096).decode()
                except OSError:
                    continue
                if hello.startswith("trainhook-gang/2"):
                    conn.sendall(b"ok 0\ngo\n")
                elif next(self.turn) % 2:
                    conn.sendall(f"ok 0 {NONCE} key\ngo {'0' * 64}\n".encode())
                else:
                    conn.sendall(f"ok 0 {NONCE} address\ngo\n".encode())
                time.sleep(0.2)

    def close(self) -> None:
        self.server.close()


def test_with_the_key_a_member_is_not_released_by_what_answers_in_rank_0s_place(keyed):
    envs, hosts, port = keyed
    fake = FakeRank0(port)
    try:
        code, out, err = finish(keyed_wait(envs[1], hosts, timeout=6))
    finally:
        fake.close()
    assert code == 1, f"a member took a go from something without the key:\n{out}{err}"
    assert "all peers are there" not in out
    assert "gave up after 6s" in err
