"""A stand-in for a training process, for the gang lifecycle tests: plain Python, no framework.

Every rank meets rank 0 at MASTER_ADDR:MASTER_PORT (a rendezvous, as torch's would be: it shows that each
attempt's members find each other, on the attempt's own port), then "trains" for a while and exits 0.
It prints what it does, with the attempt it belongs to (TRAINHOOK_ATTEMPT), so the tests can count the runs.

Behaviour from the environment:
  TRAIN_SECONDS          how long to train (default 2); TRAIN_SECONDS_RANK<r> overrides it for rank r
  TRAIN_FAIL             "RANK:CODE:ATTEMPT[:AFTER]": that rank exits CODE (or kills itself: CODE=kill) after
                         AFTER seconds of training (default 1), on that attempt only ("*" for every attempt)
"""

import os
import signal
import socket
import sys
import time

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
ATTEMPT = int(os.environ.get("TRAINHOOK_ATTEMPT", "0"))


def say(text: str) -> None:
    print(f"{text} rank={RANK} attempt={ATTEMPT} t={time.time():.3f}", flush=True)


def stopped(signum, frame):
    say(f"STOPPED by {signal.Signals(signum).name}")
    sys.exit(128 + signum)


def rendezvous() -> None:
    address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    if RANK == 0:
        server = socket.create_server(("", port), reuse_port=False)
        server.settimeout(60)
        heard = []
        for _ in range(WORLD - 1):
            conn, _ = server.accept()
            heard.append(conn.recv(64).decode())
            conn.close()
        server.close()
        assert all(h.endswith(f"@{ATTEMPT}") for h in heard), heard
        say(f"RENDEZVOUS port={port} heard={sorted(heard)}")
        return
    deadline = time.monotonic() + 60
    while True:
        try:
            with socket.create_connection((address, port), timeout=2) as conn:
                conn.sendall(f"{RANK}@{ATTEMPT}".encode())
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    say(f"RENDEZVOUS port={port}")


def main() -> None:
    signal.signal(signal.SIGTERM, stopped)
    say("TRAIN START")
    rendezvous()
    seconds = float(os.environ.get(f"TRAIN_SECONDS_RANK{RANK}", os.environ.get("TRAIN_SECONDS", "2")))
    fail = os.environ.get("TRAIN_FAIL", "")
    if fail:
        rank, code, attempt, *after = fail.split(":")
        if int(rank) == RANK and attempt in ("*", str(ATTEMPT)):
            time.sleep(float(after[0]) if after else 1.0)
            say(f"FAIL with {code}")
            if code == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            sys.exit(int(code))
    time.sleep(seconds)
    say("TRAIN END")


if __name__ == "__main__":
    main()
