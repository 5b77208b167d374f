"""What the e2e tests share besides fixtures (tests/e2e/conftest.py): waiting, kubectl, Helm, one-shot pods, and
following logs. Imported by the test modules as `e2e_helpers` (pytest puts this folder on sys.path)."""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RELEASE, RELEASE_NAMESPACE = "trainhook", "trainhook"


# Run in a pod by Cluster.processes: pid, parent, state and command of each process, then its threads' waits.
PROCESSES = """
import os
def read(path):
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return "?"
for pid in sorted((p for p in os.listdir("/proc") if p.isdigit()), key=int):
    fields = read(f"/proc/{pid}/stat").rpartition(")")[2].split()
    print(pid, "ppid", fields[1] if fields else "?", "state", fields[0] if fields else "?",
          read(f"/proc/{pid}/cmdline").replace(chr(0), " ")[:300])
    for tid in sorted(os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else [], key=int):
        print("   thread", tid, read(f"/proc/{pid}/task/{tid}/comm").strip(), "wchan",
              read(f"/proc/{pid}/task/{tid}/wchan"))
"""


def _load(name: str, path: Path):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


node_mod = _load("trainhook_hack_node", REPO / "hack" / "node.py")


def wait_for(predicate, timeout: float, what: str, interval: float = 0.5):
    """The first truthy value of `predicate()`, or a failure naming `what` (and the last error) after `timeout`."""
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as e:  # noqa: BLE001  the thing waited for may not exist yet
            last_error = e
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}" + (f" (last error: {last_error})" if last_error else ""))


class Cluster:
    """The node as the tests use it: API clients, kubectl, the images' references."""

    def __init__(self, node):
        self.node = node
        self.images: dict[str, str] = node.images
        self.env = {**os.environ, **node.env()}
        self.kubectl_bin = str(Path(node.env()["PATH"].split(":")[0]) / "kubectl")

    def api_client(self):
        return self.node.api_client()

    def kubectl(self, *args: str, check: bool = True, timeout: float = 120, input: str | None = None) -> str:
        done = subprocess.run([self.kubectl_bin, *args], capture_output=True, text=True, env=self.env,
                              timeout=timeout, input=input)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {done.returncode}:\n{done.stderr}{done.stdout}")
        return done.stdout

    def apply(self, namespace: str, objects: list[dict]) -> None:
        self.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                          "items": objects}))

    def pod(self, namespace: str, name: str) -> dict:
        return json.loads(self.kubectl("get", "pod", "-n", namespace, name, "-o", "json"))

    def logs(self, namespace: str, pod: str, container: str | None = None, previous: bool = False) -> str:
        args = ["logs", "-n", namespace, pod] + (["-c", container] if container else []) + \
            (["--previous"] if previous else [])
        return self.kubectl(*args, check=False)

    def processes(self, namespace: str, pod: str) -> str:
        """What a failing test prints about a pod that did not end: each process of its container and each of
        their threads, with state and kernel wait channel (a launcher waiting on its child, a child that did not
        exit), read from /proc by the image's own Python."""
        return self.kubectl("exec", "-n", namespace, pod, "--", "python", "-c", PROCESSES, check=False, timeout=30)

    def kill_container(self, namespace: str, pod: str, container: str, signal: str = "SIGKILL") -> str:
        """Signal a running container's main process from the host, through containerd (what an OOM kill or a
        crash does to it); the container's ID. The kubelet then restarts it per the pod's restartPolicy."""
        status = next(s for s in self.pod(namespace, pod)["status"]["containerStatuses"] if s["name"] == container)
        assert "running" in status["state"], status
        cid = status["containerID"].split("://", 1)[1]
        node_mod.host.ctr(self.node.paths, "tasks", "kill", "--signal", signal, cid)
        return cid

    def describe(self, namespace: str) -> str:
        """What a failing test prints: the namespace's pods and events."""
        return self.kubectl("get", "pods,events", "-n", namespace, "-o", "wide", check=False)


def helm(cluster: Cluster, *args: str, timeout: float = 300) -> str:
    helm = subprocess.run([sys.executable, str(REPO / "hack" / "get_helm.py")], capture_output=True, text=True,
                          check=True).stdout.strip()
    home = Path(helm).parent / "home"
    env = {**cluster.env, "HELM_CONFIG_HOME": str(home / "config"), "HELM_CACHE_HOME": str(home / "cache"),
           "HELM_DATA_HOME": str(home / "data")}
    done = subprocess.run([helm, *args], capture_output=True, text=True, env=env, timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} exited {done.returncode}:\n{done.stderr}{done.stdout}")
    return done.stdout


def image_values(images: dict[str, str]) -> list[str]:
    """The chart values the e2e install sets, and nothing else: the local images, and a pull policy that never
    pulls (no registry is reachable)."""
    webhook_repo, webhook_tag = images["webhook"].rsplit(":", 1)
    launcher_repo, launcher_tag = images["launcher"].rsplit(":", 1)
    return ["--set", f"image.repository={webhook_repo}", "--set", f"image.tag={webhook_tag}",
            "--set", "image.pullPolicy=Never",
            "--set", f"launcherImage.repository={launcher_repo}", "--set", f"launcherImage.tag={launcher_tag}"]


def wait_pod_phase(cluster: Cluster, namespace: str, name: str, phases: set[str], timeout: float = 120) -> dict:
    def reached():
        pod = cluster.pod(namespace, name)
        return pod if pod["status"].get("phase") in phases else None
    try:
        return wait_for(reached, timeout, f"pod {namespace}/{name} to reach {sorted(phases)}")
    except pytest.fail.Exception:
        print(cluster.describe(namespace), file=sys.stderr)
        raise


def run_pod(cluster: Cluster, namespace: str, name: str, image: str, command: list[str], timeout: float = 120,
            **spec) -> tuple[dict, str]:
    """Run a one-shot pod to completion; (the pod as the API server has it, its log). Fails when it fails."""
    cluster.apply(namespace, [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "restartPolicy": "Never", "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never",
                                                  "command": command}], **spec}}])
    pod = wait_pod_phase(cluster, namespace, name, {"Succeeded", "Failed"}, timeout)
    log = cluster.logs(namespace, name)
    assert pod["status"]["phase"] == "Succeeded", f"pod {name} failed; its log:\n{log}"
    return pod, log


class LogFollower:
    """`kubectl logs -f` of a pod's container into memory, in a thread, from the moment the container starts: a
    StatefulSet that a finished gang scales to zero deletes its pods, and their logs with them. With `restarts`,
    every instance of the container the kubelet starts is followed in turn, each once (by its container ID)."""

    def __init__(self, cluster: Cluster, namespace: str, pod: str, container: str, restarts: bool = False):
        self.text = ""
        self.instances = 0
        self._cluster, self._namespace, self._pod, self._container = cluster, namespace, pod, container
        self._command = [cluster.kubectl_bin, "logs", "-f", "-n", namespace, pod, "-c", container]
        self._env = cluster.env
        self._restarts = restarts
        self._proc: subprocess.Popen | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()

    def _container_id(self) -> str | None:
        try:
            statuses = self._cluster.pod(self._namespace, self._pod)["status"].get("containerStatuses") or []
        except AssertionError:  # not created yet, or gone
            return None
        status = next((s for s in statuses if s["name"] == self._container), {})
        started = "running" in status.get("state", {}) or "terminated" in status.get("state", {})
        return status.get("containerID") if started else None

    def _follow(self):
        seen: set[str] = set()
        while not self._stopped.is_set():
            instance = self._container_id() if self._restarts else None
            if self._restarts and (instance is None or instance in seen):
                time.sleep(0.5)
                continue
            self._proc = subprocess.Popen(self._command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          env=self._env)
            got = ""
            for line in self._proc.stdout:
                got += line
                self.text += line
            if self._proc.wait() == 0 and got:
                self.instances += 1
                if not self._restarts:
                    return  # the container ended (or the pod went): its whole log is here
                seen.add(instance)
            time.sleep(0.5)  # not started yet (PodInitializing), or not created yet: try again

    def stop(self):
        self._stopped.set()
        if self._proc and self._proc.poll() is None:
            self._proc.terminate()
        self._thread.join(10)


@contextmanager
def shown_on_failure(cluster: Cluster, namespace: str, followers: dict[str, "LogFollower"]):
    """What a failing wait prints before it fails: the tail of every followed log, the namespace's pods and
    events."""
    try:
        yield
    except BaseException:
        for name, follower in followers.items():
            print(f"--- {name} ({follower.instances} container instances followed)\n{follower.text[-3000:]}")
        print(cluster.describe(namespace))
        raise


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()
