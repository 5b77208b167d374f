"""A real notary for tests that run launchers outside `trainhook local` (on this host's loopback, no pod network).

`GangNotary(run_dir)` starts the real webhook process (trainhook/local/admission.WebhookServer) with its notary on
127.0.0.1: real HTTPS with a certs/build.py CA, the notary's own code and membership rules, and the local authority
(webhook/notary/local.py) over `run_dir`. `admit(workload)` does what `trainhook local` does before it runs pods:
the workload and the pods its controller makes go through the real webhook's mutation, are stored with uids and
ownerReferences (RUN_DIR/pods/POD/pod.json, RUN_DIR/notary/workloads), and each pod's projected identity token is
written and recorded (RUN_DIR/notary/tokens). `env(pod)` is the pod's training container's environment as the
kubelet resolves it from the mutated spec, so a launcher started with it finds the notary the webhook injected
(`https://localhost:<port>`, TRAINHOOK_NOTARY_CA) and presents its own pod's token (TRAINHOOK_IDENTITY_TOKEN: the
projected path exists only inside a pod; here it names the file the runner wrote for that pod).

Nothing here answers for the notary: a launcher gets a key only if the webhook's notary says its pod is a member.
"""

from __future__ import annotations

import json
import random
import ssl
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from trainhook.gang import keys
from trainhook.local.admission import WebhookServer
from trainhook.local.controllers import ADMIN_USER, pod_requests, store
from trainhook.local.envvars import PodFacts, Sources, container_env
from trainhook.local.network import PodNet
from trainhook.local.pods import training_container_name
from trainhook.local.state import build_local_pod
from trainhook.webhook.notary.local import store_workloads, stored_events, workload_path

NOTARY_URL = "https://localhost:{port}"


class GangNotary:
    """The webhook process (admission + notary over `run_dir`) for the length of a `with` block."""

    def __init__(self, run_dir: Path, environ: dict[str, str] | None = None):
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self.server = WebhookServer(run_dir / "webhook", environ, notary_dir=run_dir, notary_url=NOTARY_URL)
        self.rng = random.Random()
        self.pods: dict[str, dict] = {}

    def __enter__(self) -> GangNotary:
        self.server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.__exit__(*exc)

    @property
    def url(self) -> str:
        return NOTARY_URL.format(port=self.server.notary_port)

    @property
    def ca_pem(self) -> str:
        return self.server.ca_file.read_text()

    def admit(self, workload: dict, pods: list[dict] | None = None) -> list[dict]:
        """Admit `workload` (a StatefulSet, Job or bare Pod) and the pods its controller creates (or `pods`, for
        pods made by hand), store them as `trainhook local` does; returns the stored pods, in order."""
        client = self.server.client()
        stored = store(client.admit(workload, ADMIN_USER).obj, self.rng)
        store_workloads(self.run_dir, [stored])
        requests = pod_requests(stored)
        made = [store(client.admit(r.pod, r.user).obj, self.rng) for r in requests] if requests else [stored]
        made += [store(client.admit(p, ADMIN_USER).obj, self.rng) for p in pods or []]
        for pod in made:
            self.store_pod(pod)
        return made

    def store_pod(self, pod: dict) -> None:
        """The runner's part for one stored pod: pod.json, its volumes and its identity token."""
        build_local_pod(pod, PodNet("host", "127.0.0.1"), self.run_dir, Sources({}, {}))
        self.pods[pod["metadata"]["name"]] = pod

    def delete_pod(self, name: str) -> None:
        """The pod leaves the API server (its token then names a pod that does not exist)."""
        (self.run_dir / "pods" / name / "pod.json").unlink()

    def token_file(self, name: str) -> Path:
        return self.run_dir / "pods" / name / "volumes" / keys.IDENTITY_VOLUME / "token"

    def env(self, pod: dict | str) -> dict[str, str]:
        """The training container's environment as the kubelet resolves it, and this pod's token on this host."""
        pod = self.pods[pod] if isinstance(pod, str) else pod
        name = training_container_name(pod)
        container = next(c for c in pod["spec"]["containers"] if c.get("name") == name)
        env = container_env(container, pod, PodFacts(pod_ip="127.0.0.1"), Sources({}, {}))
        if keys.TH_NOTARY in env:
            env["TRAINHOOK_IDENTITY_TOKEN"] = str(self.token_file(pod["metadata"]["name"]))
        return env

    def credential(self, name: str) -> dict:
        """POST /v1/credential as pod `name` (the test plays that pod's launcher): the notary's answer."""
        request = urllib.request.Request(self.url + "/v1/credential", data=b"{}", method="POST", headers={
            "Authorization": f"Bearer {self.token_file(name).read_text()}", "Content-Type": "application/json"})
        context = ssl.create_default_context(cadata=self.ca_pem)
        try:
            with urllib.request.urlopen(request, context=context, timeout=10) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as e:
            return {"status": e.code, **json.loads(e.read() or b"{}")}

    def key(self, name: str) -> bytes:
        """The gang's signing key as pod `name`'s launcher gets it from the notary (its own token)."""
        answer = self.credential(name)
        assert "key" in answer, f"the notary gave {name} no key: {answer}"
        return bytes.fromhex(answer["key"])

    def notary_env(self, pod: dict | str) -> dict[str, str]:
        """Only what the webhook injected for the notary into `pod` (URL, CA) and this pod's token on this host:
        for a test that writes the rest of a member's environment itself (its own ports, timeouts)."""
        env = self.env(pod)
        return {name: env[name] for name in (keys.TH_NOTARY, keys.TH_NOTARY_CA, "TRAINHOOK_IDENTITY_TOKEN")}

    def workload(self, namespace: str, kind: str, name: str) -> dict:
        """The workload as stored now, with what the notary recorded on it."""
        return json.loads(workload_path(self.run_dir, namespace, kind, name).read_text())

    def events(self) -> list[dict]:
        return stored_events(self.run_dir)


def indexed_job(name: str, namespace: str, completions: int = 1, restart_policy: str = "OnFailure",
                command: list[str] | None = None, framework: str = "pytorch") -> dict:
    """An Indexed Job gang as a user writes it (the webhook wraps its command in the launcher and stamps it)."""
    labels = {keys.FRAMEWORK: framework}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": namespace,
                                                                  "labels": labels},
            "spec": {"completionMode": "Indexed", "completions": completions, "parallelism": completions,
                     "backoffLimit": 0, "template": {"metadata": {"labels": labels}, "spec": {
                         "restartPolicy": restart_policy, "subdomain": name,
                         "containers": [{"name": "trainer", "image": "ignored",
                                         "command": command or ["python", "train.py"]}]}}}}


def mpi_gang(notary: GangNotary, job: str = "pi", namespace: str = "team-a", workers: int = 1) -> tuple[dict, list[dict]]:
    """An MPI gang as a Kubeflow MPIJob is written for trainhook: Indexed Jobs `<job>-launcher` (1 pod, rank 0, the
    gang's anchor) and `<job>-worker` (`workers` pods), admitted and stored; returns (the launcher's pod, the
    workers' pods). Each worker is a member through its own Job, which carries the gang's job name."""
    shape = f"launcher=1,worker={workers}"

    def role_job(role: str, completions: int) -> dict:
        labels = {keys.FRAMEWORK: "mpi", keys.JOB_NAME: job, keys.ROLE: role}
        made = indexed_job(f"{job}-{role}", namespace, completions, restart_policy="Never", framework="mpi")
        made["metadata"].update(labels=labels, annotations={keys.REPLICAS: shape})
        made["spec"]["template"]["metadata"]["labels"] = dict(labels)
        made["spec"]["template"]["spec"]["subdomain"] = job
        return made

    [launcher] = notary.admit(role_job("launcher", 1))
    return launcher, notary.admit(role_job("worker", workers))


class MpiGangCredentials:
    """What the two sides of a real MPI gang (`mpi_gang`: one launcher, one worker) get from the real webhook's
    notary: `key`, the gang's signing key as the launcher's pod gets it with its own token, and `worker_env`, what
    the webhook injected into the worker pod for the notary (URL, CA) with that pod's token on this host.

    Why a holder that a fixture fills: the MPI tests' helpers (a worker process, the launcher's end of its channel)
    read these wherever a test builds one, so one module-wide notary serves every test of the module:

        CREDENTIALS = MpiGangCredentials()
        mpi_notary = CREDENTIALS.fixture()  # then CREDENTIALS.key, CREDENTIALS.worker_env
    """

    def __init__(self) -> None:
        self.key = b""
        self.worker_env: dict[str, str] = {}

    @contextmanager
    def serve(self, run_dir: Path) -> Iterator[GangNotary]:
        """The notary over the gang, admitted and stored in `run_dir`, for the `with` block; fills the holder."""
        with GangNotary(run_dir) as notary:
            launcher, [worker] = mpi_gang(notary)
            self.key = notary.key(launcher["metadata"]["name"])
            self.worker_env = notary.notary_env(worker)
            yield notary

    def fixture(self):
        """A module-scoped autouse fixture named `mpi_notary` that serves the gang while the module's tests run."""

        @pytest.fixture(autouse=True, scope="module")
        def mpi_notary(tmp_path_factory) -> Iterator[GangNotary]:
            with self.serve(tmp_path_factory.mktemp("notary") / "run") as notary:
                yield notary

        return mpi_notary
