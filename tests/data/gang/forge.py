"""An outsider's attempts to end or restart a gang it does not belong to, for the gang lifecycle tests.

It runs in a pod of another job (and namespace), so the webhook gave it that job's TRAINHOOK_GANG_TOKEN, and
speaks the launchers' protocol to the victim's coordinator (rank 0's launcher):
  - a forged failure: "rank 1 exited with 3", signed with its own gang's token;
  - a forged completion: "rank 0 exited 0", signed with its own gang's token;
  - the same failure signed with a random token;
  - a greeting under its own identity (another gang).
Every one must be refused. It prints one line per attempt: `REFUSED <what>: <the coordinator's answer>`, or
`ACCEPTED <what>` (then it exits 1).

  FORGE_TARGET     the victim coordinator's address (host; the port is 29497)
  FORGE_NAMESPACE  the victim's namespace;  FORGE_JOB  the victim's job name
"""

import os
import secrets
import socket
import sys
import time

from trainhook.launcher import gang_protocol as wire

TARGET, PORT = os.environ["FORGE_TARGET"], int(os.environ.get("FORGE_PORT", "29497"))
NAMESPACE, JOB = os.environ["FORGE_NAMESPACE"], os.environ["FORGE_JOB"]
OWN_TOKEN = os.environ["TRAINHOOK_GANG_TOKEN"].encode()
OWN_NAMESPACE, OWN_JOB = os.environ["TRAINHOOK_NAMESPACE"], os.environ["TRAINHOOK_JOB_NAME"]


def connect() -> socket.socket:
    deadline = time.monotonic() + 60
    while True:
        try:
            return socket.create_connection((TARGET, PORT), timeout=5)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def attempt(what: str, token: bytes, rank: int, report: dict, namespace: str = NAMESPACE, job: str = JOB) -> bool:
    """True when the coordinator refused."""
    with connect() as sock:
        sock.settimeout(10)
        nonce = wire.new_nonce()
        wire.send_plain(sock, wire.member_greeting(namespace, job, rank, nonce))
        reader = wire.LineReader(sock)
        answer = reader.read()
        if answer is None or "error" in answer:
            print(f"REFUSED {what}: {answer and answer.get('error')}", flush=True)
            return True
        channel = wire.Channel(sock, reader, token, "member", answer["nonce"], nonce)
        channel.send({"type": "join", "rank": rank, "report": report})
        try:
            reply = reader.read()
        except OSError as e:
            reply = {"error": f"connection closed ({e})"}
        if reply is None or "error" in reply:
            print(f"REFUSED {what}: {reply and reply.get('error')}", flush=True)
            return True
        print(f"ACCEPTED {what}: {reply}", flush=True)
        return False


def main() -> int:
    failure = {"attempt": 1, "status": "exited", "code": 3, "restarts": 0, "since": None, "outcome": None}
    completion = {"attempt": 1, "status": "exited", "code": 0, "restarts": 0, "since": None, "outcome": None}
    results = [
        attempt("failure of rank 1 signed with another job's token", OWN_TOKEN, 1, failure),
        attempt("completion of rank 0 signed with another job's token", OWN_TOKEN, 0, completion),
        attempt("failure of rank 1 signed with a random token", secrets.token_hex(32).encode(), 1, failure),
        attempt(f"greeting as {OWN_NAMESPACE}/{OWN_JOB}", OWN_TOKEN, 1, failure, OWN_NAMESPACE, OWN_JOB),
    ]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
