"""MPI gangs on the node, over the default (gang) transport and over ssh, with no exec permission granted to anyone
(issue 22: the chart binds nothing to training ServiceAccounts).

Over the gang transport: the launcher's rsh agent asks each worker's own `trainhook-launch mpi-worker` (over the
gang's authenticated channel, through the launcher's private doorway) to start Open MPI's daemons in the worker
pods: no API call, no sshd, with the user's MPI image (Debian's Open MPI and mpi4py, nothing of trainhook). examples/mpi/allreduce.yaml's gang as one StatefulSet (v1.20 has no Indexed Jobs): pod 0 launches,
every member parks once mpirun is done, the outcome is recorded and the StatefulSet scaled to zero."""

from __future__ import annotations

import re
import subprocess

import yaml

from e2e_gangs import (NAMESPACE, apply_gang, delete_documents, delete_gang, example_documents, for_the_node,
                       phase_of, statefulset, statefulset_gang)
from e2e_helpers import LogFollower, REPO, b64, shown_on_failure, wait_for

NAME = "mpi-allreduce"


def test_an_mpi_gang_runs_its_ranks_in_the_worker_pods_over_the_gang_transport_with_no_exec_grant(node, release):
    script = [d for d in yaml.safe_load_all((REPO / "examples" / "mpi" / "allreduce.yaml").read_text())
              if d and d["kind"] == "ConfigMap"][0]["data"]["allreduce.py"]
    objects = statefulset_gang(NAME, node.images["mpi"], ["python3", "-c", script], 3, framework="mpi")
    delete_gang(node, NAME)
    follower = None
    try:
        node.apply(NAMESPACE, objects)
        follower = LogFollower(node, NAMESPACE, f"{NAME}-0", "trainer")

        def done():
            sts = statefulset(node, NAME)
            phase = (sts["metadata"].get("annotations") or {}).get("trainhook.dev/phase")
            assert phase != "Failed", follower.text[-3000:]
            return phase == "Succeeded" and sts
        with shown_on_failure(node, NAMESPACE, {f"{NAME}-0": follower}):
            sts = wait_for(done, 180, "the MPI gang to succeed", interval=2)
        text = follower.text
        assert "OpenMPI, gang transport" in text
        # Nobody in the namespace may exec into the workers: the ranks above ran without that right.
        assert node.kubectl("auth", "can-i", f"--as=system:serviceaccount:{NAMESPACE}:default", "create",
                            "pods/exec", "-n", NAMESPACE, check=False).strip() == "no"
        assert re.search(rf"allreduce over 3 ranks on 3 hosts \({NAME}-0, {NAME}-1, {NAME}-2\): sum=6 expected=6",
                         text), text[-3000:]
        assert "mpi library: Open MPI" in text
        assert sts["metadata"]["annotations"]["trainhook.dev/exit-code"] == "0"
        wait_for(lambda: statefulset(node, NAME)["spec"]["replicas"] == 0, 60, "the StatefulSet scaled to zero")
    finally:
        if follower is not None:
            follower.stop()
        delete_gang(node, NAME, wait=False)


def test_an_mpi_gang_over_ssh_with_keys_from_a_secret_and_sshd_in_the_workers(node, release, tmp_path):
    """mpi-operator v2's way on the node: examples/mpi/sgd.yaml (a launcher and 2 workers of 2 slots), its Indexed
    Jobs as StatefulSets (v1.20), keys generated here into a Secret mounted at /root/.ssh with mpi-operator's
    items, the workers running the image's own sshd beside the delivered `trainhook-launch mpi-worker`, and the
    launcher's rsh agent calling ssh across the pod network."""
    key = tmp_path / "id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "trainhook-e2e", "-f", str(key)], check=True)
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "sgd-ssh"}, "type": "kubernetes.io/ssh-auth",
              "data": {"ssh-privatekey": b64(key.read_text()), "ssh-publickey": b64(key.with_suffix(".pub").read_text())}}
    volume = {"name": "ssh-auth", "secret": {"secretName": "sgd-ssh", "defaultMode": 0o600, "items": [
        {"key": "ssh-privatekey", "path": "id_rsa"}, {"key": "ssh-publickey", "path": "id_rsa.pub"},
        {"key": "ssh-publickey", "path": "authorized_keys"}]}}
    documents = for_the_node(example_documents(REPO / "examples" / "mpi" / "sgd.yaml"), node.images["mpi"])
    for doc in documents:
        if doc["kind"] != "StatefulSet":
            continue
        spec = doc["spec"]["template"]["spec"]
        spec.setdefault("volumes", []).append(volume)
        (container,) = spec["containers"]
        container.setdefault("volumeMounts", []).append({"name": "ssh-auth", "mountPath": "/root/.ssh"})
        if doc["metadata"]["name"] == "sgd-worker":  # mpi-operator v2's worker command
            container["command"] = ["/usr/sbin/sshd", "-De"]
        else:
            container.setdefault("env", []).append({"name": "TRAINHOOK_MPI_TRANSPORT", "value": "ssh"})
    documents.append(secret)
    followers: dict[str, LogFollower] = {}
    try:
        apply_gang(node, documents)
        for pod in ("sgd-launcher-0", "sgd-worker-0", "sgd-worker-1"):
            followers[pod] = LogFollower(node, NAMESPACE, pod, "mpi")

        def done():
            phases = {name: phase_of(node, name) for name in ("sgd-launcher", "sgd-worker")}
            assert all(p.get("trainhook.dev/phase") != "Failed" for p in phases.values()), phases
            return all(p.get("trainhook.dev/phase") == "Succeeded" for p in phases.values()) and phases
        with shown_on_failure(node, NAMESPACE, followers):
            phases = wait_for(done, 240, "the MPI gang over ssh to succeed", interval=2)
        assert all(p["trainhook.dev/exit-code"] == "0" for p in phases.values()), phases
        launcher = followers["sgd-launcher-0"].text
        assert "OpenMPI, ssh transport" in launcher, launcher[-3000:]
        assert "training on 4 ranks (sgd-worker-0: 2, sgd-worker-1: 2)" in launcher, launcher[-3000:]
        assert "identical-across-ranks=True" in launcher, launcher[-3000:]
        wait_for(lambda: all("launcher finished: mpirun exited with 0" in followers[w].text
                             for w in ("sgd-worker-0", "sgd-worker-1")), 30, "the workers to hear the outcome")
        for worker in ("sgd-worker-0", "sgd-worker-1"):
            text = followers[worker].text
            assert "started /usr/sbin/sshd -De" in text, text[-3000:]
            assert "Accepted publickey for root" in text, text[-3000:]  # the daemons really came in over ssh
    finally:
        for follower in followers.values():
            follower.stop()
        delete_documents(node, documents)
