"""The coordinator alone at 1,000 and 10,000 members (issue 32): its CPU per member per round, memory, threads.

bench/gang_scale_sim.py runs the launcher's own Link per member, one thread each; at 10,000 members on 2 cores
those threads, not the coordinator, were the run's limit (docs/develop/performance.md). Here the members are
sockets in a few `selectors` loops (4 processes) speaking the gang's wire by hand (wire.member_greeting,
wire.sign), so that the real Coordinator, in a process of its own on loopback, is what is measured: every member
joins, attempt 1 starts, member 1 exits 137 under restart-gang (every member stops, attempt 2 starts), every member
exits 0, then rank 0, and every member acknowledges the outcome. The members do not check the coordinator's
signatures (the launcher's Link does; it costs the members, not the coordinator).

    python bench/coordinator_scale.py --members 10000 [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainhook.launcher import wire  # noqa: E402

KEY = b"bench-coordinator-scale-key-0123456789"
PROCESSES = 4


def gang_env(size: int) -> dict[str, str]:
    return {"TRAINHOOK_FRAMEWORK": "pytorch", "TRAINHOOK_JOB_NAME": "g", "TRAINHOOK_NAMESPACE": "ns",
            "TRAINHOOK_ROLE": "worker", "TRAINHOOK_INDEX": "0", "TRAINHOOK_REPLICAS": f"worker={size}",
            "TRAINHOOK_HOSTS": "worker=g", "TRAINHOOK_SUBDOMAIN": "g"}


def run_coordinator(size: int, port: int) -> None:
    from trainhook.launcher.coordination.coordinator import Coordinator
    from trainhook.launcher.pod_view import parse_gang
    from trainhook.launcher.policy import RESTART_GANG, GangPolicy
    coordinator = Coordinator(parse_gang(gang_env(size)), GangPolicy(RESTART_GANG, 3), KEY, port, log=lambda line: None)
    coordinator.start()
    print("listening", flush=True)
    sys.stdin.read()  # until the parent closes it
    coordinator.close()


class Member:
    __slots__ = ("rank", "sock", "inbuf", "nonce", "coordinator_nonce", "sent", "status", "attempt", "joined")

    def __init__(self, rank: int, sock: socket.socket):
        self.rank, self.sock, self.inbuf = rank, sock, b""
        self.nonce, self.coordinator_nonce, self.sent = wire.new_nonce(), "", 0
        self.status, self.attempt, self.joined = "idle", 0, False

    def send(self, body: dict) -> None:
        mac = wire.sign(KEY, wire.TO_COORDINATOR, self.coordinator_nonce, self.nonce, self.sent, body)
        self.sock.sendall(wire.canonical({"seq": self.sent, "body": body, "mac": mac}).encode() + b"\n")
        self.sent += 1

    def report(self, status: str, code: int | None = None, outcome: dict | None = None) -> None:
        self.status = status
        self.send({"type": "state", "report": {"attempt": self.attempt, "status": status, "code": code,
                                               "restarts": 0, "since": None, "outcome": outcome}})


def run_members(size: int, port: int, low: int, high: int) -> None:
    """Members low..high-1 in one selectors loop; stdin: `fail R`, `finish`, `finish0`; stdout: `all WHAT TIME`."""
    selector = selectors.DefaultSelector()
    members: list[Member] = []
    waiting = iter(range(low, high))

    def connect_some(count: int = 50) -> None:
        """A few members connect and greet, then the loop answers what came back (a Link does its handshake
        right after its connect; thousands of connects first would leave them all unauthenticated)."""
        for rank in waiting:
            while True:  # a full accept queue refuses: retry, as a member's Link does
                try:
                    sock = socket.create_connection(("127.0.0.1", port))
                    break
                except ConnectionRefusedError:
                    time.sleep(0.05)
            member = Member(rank, sock)
            sock.sendall(wire.canonical(wire.member_greeting("ns", "g", rank, member.nonce)).encode() + b"\n")
            members.append(member)
            selector.register(sock, selectors.EVENT_READ, member)
            count -= 1
            if not count:
                return
    selector.register(sys.stdin, selectors.EVENT_READ, None)
    counts: dict[str, int] = {}

    def count(what: str) -> None:
        counts[what] = counts.get(what, 0) + 1
        if counts[what] == high - low:
            print(f"all {what} {time.time()}", flush=True)

    while True:
        if len(members) < high - low:
            connect_some()
        for key, _ in selector.select(0 if len(members) < high - low else None):
            member = key.data
            if member is None:
                words = sys.stdin.readline().split()
                if not words:
                    return
                if words[0] == "fail":
                    failing = members[int(words[1]) - low]
                    failing.report("exited", 137)
                for m in members:
                    if words[0] == "finish" and m.rank != 0 or words[0] == "finish0" and m.rank == 0:
                        m.report("exited", 0)
                continue
            chunk = member.sock.recv(65536)
            if not chunk:
                raise SystemExit(f"rank {member.rank}: the coordinator closed the connection")
            member.inbuf += chunk
            while b"\n" in member.inbuf:
                line, member.inbuf = member.inbuf.split(b"\n", 1)
                message = json.loads(line)
                if not member.coordinator_nonce:
                    member.coordinator_nonce = message["nonce"]
                    member.send({"type": "join", "rank": member.rank, "report": {
                        "attempt": 0, "status": "idle", "code": None, "restarts": 0, "since": None, "outcome": None}})
                    continue
                body = message["body"]
                if body["type"] == "welcome" and not member.joined:
                    member.joined = True
                    count("joined")
                elif body["type"] == "start" and member.status != "running":
                    member.attempt = body["attempt"]
                    member.report("running")
                    count(f"start{member.attempt}")
                elif body["type"] == "stop" and member.status == "running":
                    member.report("stopped", 143)
                elif body["type"] == "done" and member.status != "done":
                    member.report("done", None, body["outcome"])
                    count("done")


def cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def status(pid: int) -> dict:
    lines = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {"rss_mb": int(lines["VmHWM"].split()[0]) / 1024, "threads": int(lines["Threads"]),
            "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("role", nargs="?", default="bench", choices=("bench", "coordinator", "members"))
    parser.add_argument("--members", type=int, default=1000)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ranks", default="0:1")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.role == "coordinator":
        run_coordinator(args.members, args.port)
        return 0
    if args.role == "members":
        low, high = (int(x) for x in args.ranks.split(":"))
        run_members(args.members, args.port, low, high)
        return 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    me = [sys.executable, str(Path(__file__).resolve())]
    coordinator = subprocess.Popen([*me, "coordinator", "--members", str(args.members), "--port", str(port)],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert coordinator.stdout is not None and coordinator.stdin is not None
    coordinator.stdout.readline()
    pid, n = coordinator.pid, args.members
    bounds = [n * i // PROCESSES for i in range(PROCESSES + 1)]
    before = cpu(pid)
    started = time.time()
    members = [subprocess.Popen([*me, "members", "--members", str(n), "--port", str(port), "--ranks", f"{a}:{b}"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
               for a, b in zip(bounds, bounds[1:])]

    def wait_all(what: str) -> float:
        last = 0.0
        for p in members:
            assert p.stdout is not None
            while True:
                words = p.stdout.readline().split()
                if not words:
                    raise SystemExit(f"a members process ended before `all {what}`")
                if words[1] == what:
                    last = max(last, float(words[2]))
                    break
        return last

    def tell(line: str, only: int | None = None) -> None:
        for i, p in enumerate(members):
            if only is None or i == only:
                assert p.stdin is not None
                p.stdin.write(line + "\n")
                p.stdin.flush()

    try:
        result = drive(members, wait_all, tell, pid, n, before, started)
    finally:
        for p in members:
            p.kill()
        coordinator.stdin.close()
        coordinator.wait(10)
    print(json.dumps(result) if args.json else "\n".join(f"{k:30} {v}" for k, v in result.items()))
    return 0


def drive(members, wait_all, tell, pid: int, n: int, before: float, started: float) -> dict:
    """The gang's run, once every members process is up: what it measures."""
    joined = wait_all("joined")
    start1 = wait_all("start1")
    cpu_start, assembled = cpu(pid), status(pid)
    failed = time.time()
    tell("fail 1", only=0)
    start2 = wait_all("start2")
    cpu_restart = cpu(pid)
    tell("finish")
    time.sleep(1.0)
    finished = time.time()
    tell("finish0", only=0)
    done = wait_all("done")
    cpu_end, ended = cpu(pid), status(pid)
    return {"members": n, "connect_and_join_s": joined - started, "barrier_s": start1 - joined,
              "restart_s": start2 - failed, "outcome_s": done - finished,
              "cpu_ms_per_member_join_start": (cpu_start - before) / n * 1000,
              "cpu_ms_per_member_restart": (cpu_restart - cpu_start) / n * 1000,
              "cpu_ms_per_member_finish": (cpu_end - cpu_restart) / n * 1000,
              "rss_mb": max(assembled["rss_mb"], ended["rss_mb"]), "threads": max(assembled["threads"],
                                                                                   ended["threads"]),
              "fds": assembled["fds"], "load1": os.getloadavg()[0]}


if __name__ == "__main__":
    raise SystemExit(main())
