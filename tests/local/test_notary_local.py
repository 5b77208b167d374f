"""`trainhook local` plays the kubelet for the identity volume: the projected serviceAccountToken the webhook
injects is written as a random token per pod, and recorded with the pod it names for the local notary authority
(webhook/notary/local.py), which the run's webhook serves to the pods (docs/use/local.md). The last test runs a real gang
under `trainhook local` (root, network namespaces: run it under `flock -s /tmp/trainhook-node.lock`).
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
import yaml
from gang_notary import GangNotary, indexed_job
from helpers import wait_for

from trainhook.gang import keys
from trainhook.local.envvars import EnvError, Sources
from trainhook.local.volumes import container_mounts, prepare_volumes
from trainhook.webhook.notary.local import LocalConflict, patch_stored_workload, store_workloads, workload_path

ROOT = Path(__file__).resolve().parents[2]


def gang_pod(name: str, uid: str) -> dict:
    return {"metadata": {"name": name, "namespace": "team-a", "uid": uid},
            "spec": {"serviceAccountName": "trainer", "volumes": [{"name": keys.IDENTITY_VOLUME, "projected": {
                "sources": [{"serviceAccountToken": {"audience": keys.IDENTITY_AUDIENCE, "expirationSeconds": 3600,
                                                     "path": "token"}}]}}],
                     "containers": [{"name": "trainer", "volumeMounts": [
                         {"name": keys.IDENTITY_VOLUME, "mountPath": keys.IDENTITY_DIR, "readOnly": True}]}]}}


def test_each_pod_gets_its_own_random_token_recorded_with_the_pod_it_names(tmp_path):
    tokens = {}
    for name, uid in (("ddp-0", "u0"), ("ddp-1", "u1")):
        pod = gang_pod(name, uid)
        volumes = prepare_volumes(pod, tmp_path / "pods" / name, tmp_path / "claims", Sources({}, {}))
        [mount] = container_mounts(pod["spec"]["containers"][0], volumes)
        assert mount.target == keys.IDENTITY_DIR and mount.read_only
        token = (volumes[keys.IDENTITY_VOLUME].path / "token").read_text()
        assert len(token) >= 32
        record = json.loads((tmp_path / "notary" / "tokens" / hashlib.sha256(token.encode()).hexdigest()).read_text())
        assert record == {"namespace": "team-a", "pod": name, "uid": uid, "serviceAccount": "trainer",
                          "audience": "trainhook"}
        tokens[name] = token
    assert tokens["ddp-0"] != tokens["ddp-1"]


def test_other_projected_sources_are_refused_naming_the_volume(tmp_path):
    pod = gang_pod("ddp-0", "u0")
    pod["spec"]["volumes"][0]["projected"]["sources"].append({"configMap": {"name": "x"}})
    with pytest.raises(EnvError, match="volume 'trainhook-identity': projected sources other than"):
        prepare_volumes(pod, tmp_path / "pods" / "ddp-0", tmp_path / "claims", Sources({}, {}))


# --- a real gang under `trainhook local`: the key the notary hands out stays in the launchers' memory -----------
TRAIN_DUMPING_ENV = """
import json, os, time
rank = os.environ["RANK"]
with open(f"/scratch/env-{rank}.json", "w") as f:
    json.dump(dict(os.environ), f)
print(f"rank {rank} dumped its environment", flush=True)
time.sleep(float(os.environ.get("TRAIN_SECONDS", "8")))
"""


def env_dumping_gang(name: str, replicas: int = 2) -> list[dict]:
    labels = {"trainhook.dev/framework": "pytorch"}
    container = {"name": "trainer", "image": "ignored",
                 "command": ["trainhook-launch", "run", "--", "python", "/code/train.py"],
                 "volumeMounts": [{"name": "code", "mountPath": "/code"}, {"name": "scratch", "mountPath": "/scratch"}]}
    return [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
         "spec": {"clusterIP": "None", "selector": {"trainhook.dev/job-name": name}}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-code"},
         "data": {"train.py": TRAIN_DUMPING_ENV}},
        {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name, "labels": labels},
         "spec": {"serviceName": name, "replicas": replicas, "selector": {"matchLabels": {"app": name}},
                  "template": {"metadata": {"labels": {"app": name, **labels}}, "spec": {
                      "terminationGracePeriodSeconds": 5, "containers": [container],
                      "volumes": [{"name": "code", "configMap": {"name": f"{name}-code"}},
                                  {"name": "scratch", "emptyDir": {}}]}}}},
    ]


def notary_port(run_dir: Path) -> int | None:
    """The webhook's own notary port on 127.0.0.1, from its log (the pods reach it through the runner's relay)."""
    try:
        lines = (run_dir / "webhook" / "webhook.log").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if '"notary serving"' in line:
            return json.loads(line)["port"]
    return None


def test_the_gang_key_never_reaches_the_training_process_or_any_file(tmp_path):
    """H2: the key the notary hands a member is in no environment the training process sees and in no file of
    the run (pods' volumes, status files, logs, the launcher's state, the webhook's files, pods.yaml)."""
    run_dir = tmp_path / "run"
    manifest = tmp_path / "gang.yaml"
    manifest.write_text(yaml.safe_dump_all(env_dumping_gang("keyed"), sort_keys=False))
    proc = subprocess.Popen([sys.executable, "-m", "trainhook.local.cli", str(manifest), "--timeout", "120",
                             "--workdir", str(run_dir)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=ROOT)
    try:
        # While the gang trains, ask the notary as rank 1 does (its token, the run's CA): the key it hands out.
        port = wait_for("the notary's port in webhook.log", lambda: notary_port(run_dir), 60)
        token_file = run_dir / "pods" / "keyed-1" / "volumes" / keys.IDENTITY_VOLUME / "token"
        wait_for("rank 1's identity token", token_file.exists, 60)
        request = urllib.request.Request(f"https://127.0.0.1:{port}/v1/credential", data=b"{}", method="POST",
                                         headers={"Authorization": f"Bearer {token_file.read_text()}"})
        context = ssl.create_default_context(cafile=str(run_dir / "webhook" / "certs" / "ca.crt"))
        with urllib.request.urlopen(request, context=context, timeout=10) as answer:
            credential = json.loads(answer.read())
        output, _ = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, output[-5000:]
    assert "gang default/keyed succeeded" in output
    key_hex = credential["key"]
    assert credential["job"] == "keyed" and len(key_hex) == 64
    needles = [key_hex.encode(), key_hex.upper().encode(), bytes.fromhex(key_hex)]
    dumps = sorted((run_dir / "pods").glob("keyed-*/volumes/scratch/env-*.json"))
    assert len(dumps) == 2, output[-3000:]
    for dump in dumps:
        env = json.loads(dump.read_text())
        assert env["TRAINHOOK_NOTARY"] == "https://trainhook-notary:8444"  # where, never what
        assert not [name for name, value in env.items() if key_hex in value.lower()]
        assert not [name for name in env if "KEY" in name or "TOKEN" in name], sorted(env)
    searched = [p for p in run_dir.rglob("*") if p.is_file() and not p.is_symlink()]
    assert len(searched) > 20  # the run's files are there to search
    leaks = [str(p) for p in searched if any(needle in p.read_bytes() for needle in needles)]
    assert not leaks and key_hex not in output, leaks


# --- the local authority's answers, through the real notary over HTTPS (tests/support/gang_notary.py) -------------------
ROOT_KEY = "local-notary-test-root-key-0123456789"


def test_the_local_authority_gives_members_their_gangs_key_and_refuses_everyone_else(tmp_path):
    with GangNotary(tmp_path / "run", {**os.environ, "TRAINHOOK_WEBHOOK_GANG_KEY": ROOT_KEY}) as notary:
        rank0, rank1 = notary.admit(indexed_job("g", "ns", completions=2))
        job = notary.workload("ns", "Job", "g")
        gang = f"ns/g/{job['metadata']['uid']}"
        key = hmac.new(ROOT_KEY.encode(), gang.encode(), "sha256").hexdigest()
        for pod in (rank0, rank1):
            assert notary.credential(pod["metadata"]["name"]) == {"namespace": "ns", "job": "g", "gang": gang,
                                                                  "key": key}
        # A bare Pod copying rank 1's labels and annotations (its place in the gang), with its own token: not a
        # member, since no workload of the gang controls it.
        imposter = copy.deepcopy(rank1)
        for field in ("uid", "generateName", "ownerReferences"):
            imposter["metadata"].pop(field, None)
        imposter["metadata"]["name"] = "imposter"
        notary.admit(imposter)
        refused = notary.credential("imposter")
        assert refused["status"] == 403 and "only carries the label trainhook.dev/job-name=g" in refused["error"]
        # A deleted pod's token names a pod that no longer exists.
        notary.delete_pod(rank1["metadata"]["name"])
        gone = notary.credential(rank1["metadata"]["name"])
        assert gone["status"] == 403 and "does not exist" in gone["error"]
        # A token the runner never issued authenticates nothing.
        notary.token_file(rank0["metadata"]["name"]).write_text("forged-token")
        forged = notary.credential(rank0["metadata"]["name"])
        assert forged["status"] == 401 and "no pod of this run was issued this token" in forged["error"]


def test_a_workload_record_is_written_once_and_a_stale_version_conflicts(tmp_path):
    store_workloads(tmp_path, [{"apiVersion": "apps/v1", "kind": "StatefulSet",
                                "metadata": {"name": "w", "namespace": "ns", "uid": "u"}, "spec": {"replicas": 2}}])
    patch = {"metadata": {"resourceVersion": "1", "annotations": {"trainhook.dev/phase": "Failed"}}}
    stored = patch_stored_workload(tmp_path, "ns", "StatefulSet", "w", patch)
    assert stored["metadata"]["resourceVersion"] == "2" and stored["spec"]["replicas"] == 2
    with pytest.raises(LocalConflict, match="resourceVersion 1 is not the current 2"):
        patch_stored_workload(tmp_path, "ns", "StatefulSet", "w", patch)
    assert patch_stored_workload(tmp_path, "ns", "StatefulSet", "absent", patch) is None
    with pytest.raises(ValueError, match="not a valid name"):
        workload_path(tmp_path, "ns", "StatefulSet", "../../escape")


# --- the relay from the pod network to the notary (its netns socket is exercised by every local run) -----------
def test_the_relay_copies_bytes_both_ways_and_closes_connections_beyond_its_bound(monkeypatch):
    from trainhook.local import notary_relay

    monkeypatch.setattr(notary_relay, "MAX_CONNECTIONS", 2)
    upstream = socket.create_server(("127.0.0.1", 0))

    def echo() -> None:
        while True:
            try:
                conn, _ = upstream.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    def serve(conn: socket.socket) -> None:  # answers each chunk; closes when the client has (as the notary does)
        with conn:
            for data in iter(lambda: conn.recv(100), b""):
                conn.sendall(b"echo:" + data)

    threading.Thread(target=echo, daemon=True).start()
    with notary_relay.NotaryRelay(socket.create_server(("127.0.0.1", 0)), upstream.getsockname()[1]) as relay:
        address = relay.listener.getsockname()
        first, second = socket.create_connection(address, 5), socket.create_connection(address, 5)
        for sock in (first, second):
            sock.settimeout(5)
            sock.sendall(b"hello")
            assert sock.recv(100) == b"echo:hello"
        third = socket.create_connection(address, 5)
        third.settimeout(5)
        assert third.recv(100) == b""  # closed at accept: two are open
        first.close()
        wait_for("the relay to let the first connection go", lambda: relay.connections < 2, 5)
        fourth = socket.create_connection(address, 5)
        fourth.settimeout(5)
        fourth.sendall(b"again")
        assert fourth.recv(100) == b"echo:again" and relay.relayed == 3
        for sock in (second, third, fourth):
            sock.close()
    upstream.close()
