"""A forger's attempts to join, end or restart a running gang it does not belong to (issue 22).

It runs in a pod that carries the victim gang's labels (`trainhook.dev/job-name: <victim>`) but is not owned by
the gang's workload, and holds everything anyone with the `view` role can read from the gang's pod specs: the
notary's URL and CA bundle, the namespace and job name, rank 0's address. It also has a projected identity token
of its own (audience `trainhook`: anyone who can create a pod can mount one). It tries:
  - to get the gang's key from the notary with its own token, and with no token at all;
  - to record "Succeeded" for the gang at the notary;
  - to join the victim's coordinator (rank 0's launcher) and report "rank 0 exited 0", signed with every key it
    could derive from what it read (the old spec-readable token scheme, and a random key).
Every one must be refused. It prints one line per attempt: `REFUSED <what>: <the answer>`, or `ACCEPTED <what>`
(then it exits 1).

  FORGE_TARGET     the victim coordinator's address (host; FORGE_PORT, default 29497)
  FORGE_NAMESPACE  the victim's namespace;  FORGE_JOB  the victim's job name
  TRAINHOOK_NOTARY, TRAINHOOK_NOTARY_CA   the notary, as the victim's pod spec names it; or
  FORGE_VIEW       a YAML file of pod specs as `kubectl get pods -o yaml` shows them to `view` (`trainhook local`'s
                   RUN_DIR/pods.yaml): the two are read from the victim's training container there
  TRAINHOOK_IDENTITY_TOKEN                this pod's own identity token file (default: the projected path)
"""

import hashlib
import os
import secrets
import socket
import sys
import time

from trainhook.launcher import wire
from trainhook.launcher import notary_client
from trainhook.launcher.outcome import Outcome, now_rfc3339

TARGET, PORT = os.environ["FORGE_TARGET"], int(os.environ.get("FORGE_PORT", "29497"))
NAMESPACE, JOB = os.environ["FORGE_NAMESPACE"], os.environ["FORGE_JOB"]


def connect() -> socket.socket:
    deadline = time.monotonic() + 60
    while True:
        try:
            return socket.create_connection((TARGET, PORT), timeout=5)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def join(what: str, key: bytes, rank: int, report: dict) -> bool:
    """True when the coordinator refused."""
    with connect() as sock:
        sock.settimeout(10)
        nonce = wire.new_nonce()
        wire.send_plain(sock, wire.member_greeting(NAMESPACE, JOB, rank, nonce))
        reader = wire.LineReader(sock)
        answer = reader.read()
        if answer is None or "error" in answer:
            print(f"REFUSED {what}: {answer and answer.get('error')}", flush=True)
            return True
        channel = wire.Channel(sock, reader, key, "member", answer["nonce"], nonce)
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


def ask(what: str, call) -> bool:
    """True when the notary refused."""
    try:
        answer = call()
    except notary_client.NotaryError as e:
        print(f"REFUSED {what}: {e}", flush=True)
        return e.status in (401, 403)
    print(f"ACCEPTED {what}: {answer}", flush=True)
    return False


def read_victims_spec(path: str) -> None:
    """TRAINHOOK_NOTARY and TRAINHOOK_NOTARY_CA as the victim's pod spec shows them (public: `view` reads them)."""
    import yaml

    with open(path) as f:
        pods = [p for p in yaml.safe_load_all(f) if p]
    for pod in pods:
        meta = pod["metadata"]
        if meta.get("namespace") != NAMESPACE or (meta.get("labels") or {}).get("trainhook.dev/job-name") != JOB:
            continue
        for container in pod["spec"]["containers"]:
            env = {e["name"]: e.get("value", "") for e in container.get("env") or []}
            if env.get("TRAINHOOK_NOTARY"):
                os.environ["TRAINHOOK_NOTARY"], os.environ["TRAINHOOK_NOTARY_CA"] = (env["TRAINHOOK_NOTARY"],
                                                                                   env["TRAINHOOK_NOTARY_CA"])
                print(f"read the notary's URL {env['TRAINHOOK_NOTARY']} and CA from pod {meta['name']}'s spec",
                      flush=True)
                return
    raise SystemExit(f"no pod of {NAMESPACE}/{JOB} in {path} names a notary")


def main() -> int:
    if os.environ.get("FORGE_VIEW") and not os.environ.get("TRAINHOOK_NOTARY"):
        read_victims_spec(os.environ["FORGE_VIEW"])
    notary = notary_client.from_env(os.environ)
    assert notary is not None, "TRAINHOOK_NOTARY is not set"
    anonymous = notary_client.NotaryClient(notary.url, os.environ["TRAINHOOK_NOTARY_CA"], "/dev/null")
    success = Outcome("Succeeded", 0, "rank 0 exited 0 (forged)", 0, now_rfc3339(), 1)
    completion = {"attempt": 1, "status": "exited", "code": 0, "restarts": 0, "since": None, "outcome": None}
    claim = dict(completion, status="done", outcome=success.to_dict())
    spec_token = hashlib.sha256(f"{NAMESPACE}/{JOB}".encode()).hexdigest().encode()
    results = [
        ask("the gang's key for this pod's own identity token", notary.credential),
        ask("the gang's key without a token", anonymous.credential),
        ask("recording Succeeded for the gang", lambda: notary.record_outcome(success)),
        join("completion of rank 0 signed with a key derived from the pod spec", spec_token, 0, completion),
        join("'the gang is done' from rank 1 signed with a random key", secrets.token_hex(32).encode(), 1, claim),
    ]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
