"""`trainhook local scale [RUN_DIR] statefulset/NAME --replicas N`: `kubectl scale` for a running local run.

A cluster handles `kubectl scale` in two halves, and so does a local run:
- the API server (with trainhook's webhook on the scale subresource) accepts or refuses the new size: here the
  runner calls the webhook's own `check_scale` on the StatefulSet as it was stored after mutation, and the
  command prints a refusal as kubectl would and exits 1 (a fixed-size gang cannot change size while it runs;
  an elastic one only within min..max);
- the StatefulSet controller then creates the missing ordinals (each pod admitted through the webhook, exactly
  as at the run's start) or deletes the highest ones, which the kubelet stops: SIGTERM, the pod's grace period,
  SIGKILL, no restart. A pod name is reused only once the deleted pod is gone, as the controller waits.

`trainhook local delete [RUN_DIR] pod/NAME` goes the same way: the pod is stopped as a kubelet stops a deleted pod,
and a StatefulSet's controller creates it again once it is gone (a pod replaced after an eviction).

The command and the runner talk through files in RUN_DIR/control (the runner polls it): the command writes a
request, the runner answers. Only a runner that is alive answers; the command says so when there is none.
Without RUN_DIR the command finds the run among those registered in /run/trainhook-local (one file per runner).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from pathlib import Path
from collections.abc import Callable

from trainhook.launcher.files import write_json_atomically
from trainhook.local.admission import AdmissionClient, AdmissionError
from trainhook.local.controllers import controller_user, statefulset_pods, store
from trainhook.local.envvars import Sources
from trainhook.local.manifest import STATEFULSET, type_of
from trainhook.local.network import Network
from trainhook.local.state import POD_FILE, build_local_pod, restart_policy, write_hosts_files
from trainhook.webhook.notary.local import patch_stored_workload

CONTROL = "control"
RUNNER_FILE = "runner.json"
REGISTRY = Path(os.environ.get("TRAINHOOK_LOCAL_REGISTRY", "/run/trainhook-local"))
POLL = 0.2
ANSWER_TIMEOUT = 120.0


class ScaleRefused(Exception):
    """The API server's answer to a scale it does not accept; the message is what kubectl prints."""


def ordinals(state_pods: list[dict], sts_name: str) -> dict[int, str]:
    """ordinal -> pod name of the StatefulSet's pods that exist now."""
    found = {}
    for pod in state_pods:
        refs = pod["metadata"].get("ownerReferences") or []
        if any(r.get("kind") == "StatefulSet" and r.get("name") == sts_name for r in refs):
            name = pod["metadata"]["name"]
            found[int(name.rsplit("-", 1)[1])] = name
    return found


def plan(existing: dict[int, str], replicas: int) -> tuple[list[int], list[str]]:
    """(ordinals to create, pod names to delete, highest first): the StatefulSet controller's work for a scale
    to `replicas`, pure."""
    create = [i for i in range(replicas) if i not in existing]
    delete = [existing[i] for i in sorted(existing, reverse=True) if i >= replicas]
    return create, delete


def find_statefulset(workloads: list[dict], name: str, namespace: str) -> dict:
    for workload in workloads:
        meta = workload["metadata"]
        if type_of(workload) == STATEFULSET and meta["name"] == name and meta.get("namespace") == namespace:
            return workload
    raise ScaleRefused(f'Error from server (NotFound): statefulsets.apps "{name}" not found')


def refusal(workload: dict, replicas: int) -> str | None:
    """The webhook's verdict on a scale of the stored (mutated) StatefulSet, as kubectl would print a refusal."""
    from trainhook.webhook.admission.scale import check_scale  # the webhook's own rule, the same code a cluster runs

    message = check_scale(workload, replicas)
    if message is None:
        return None
    return f"Error from server (Forbidden): admission webhook denied the request: {message}"


class Scaler:
    """The API server and StatefulSet controller of a running local run, for scale requests."""

    def __init__(self, state, manifest, network: Network, client: AdmissionClient, run_dir: Path,
                 cluster_domain: str, warn: Callable[[str], None]):
        self.state, self.network, self.client, self.run_dir = state, network, client, run_dir
        self.cluster_domain, self.warn = cluster_domain, warn
        self.sources = Sources(manifest.configmaps, manifest.secrets)
        self.rng = random.Random()
        self.supervisor = None  # set by serve()
        self._unstoring: set[asyncio.Task] = set()

    # --- the API server's half, then the controller's (blocking: run in a thread) -------------------------
    def accept(self, name: str, namespace: str, replicas: int) -> tuple[dict, list[int], list[str]]:
        """Check the scale and store the new size; (the StatefulSet, ordinals to create, pods to delete)."""
        sts = find_statefulset(self.state.workloads, name, namespace)
        message = refusal(sts, replicas)
        if message is not None:
            raise ScaleRefused(message)
        sts["spec"]["replicas"] = replicas
        patch_stored_workload(self.run_dir, namespace, STATEFULSET[1], name, {"spec": {"replicas": replicas}})
        create, delete = plan(ordinals(self.state.pods, name), replicas)
        return sts, create, delete

    def create(self, sts: dict, create: list[int]) -> tuple[list, list[str]]:
        """Admit and prepare the new pods (the controller's creations); (LocalPods, FailedCreate messages)."""
        wanted = {f"{sts['metadata']['name']}-{i}" for i in create}
        pods, failures = [], []
        for pod in statefulset_pods(sts):
            if pod["metadata"]["name"] not in wanted:
                continue
            try:
                result = self.client.admit(pod, controller_user("statefulset-controller"))
            except AdmissionError as e:  # the controller's FailedCreate event; it would retry forever
                failures.append(f"FailedCreate: create Pod {pod['metadata']['name']} in StatefulSet "
                                f"{sts['metadata']['name']} failed: {e}")
                continue
            for message in result.warnings:
                self.warn(message)
            pods.append(store(result.obj, self.rng))
        for pod in pods:
            self.state.pods.append(pod)
            self.state.nets[pod["metadata"]["name"]] = self.network.add_pod()
        write_hosts_files(self.state, self.state.nets, self.run_dir, self.cluster_domain)
        return [build_local_pod(p, self.state.nets[p["metadata"]["name"]], self.run_dir, self.sources)
                for p in pods], failures

    def forget(self, names: list[str]) -> None:
        """Deleted pods leave the cluster's DNS: every remaining pod's hosts file drops them."""
        gone = {p["metadata"]["name"]: p["metadata"].get("uid", "") for p in self.state.pods
                if p["metadata"]["name"] in names}
        self.state.pods = [p for p in self.state.pods if p["metadata"]["name"] not in names]
        write_hosts_files(self.state, self.state.nets, self.run_dir, self.cluster_domain)
        task = asyncio.get_running_loop().create_task(self._unstore_when_gone(gone))
        self._unstoring.add(task)
        task.add_done_callback(self._unstoring.discard)

    async def _unstore_when_gone(self, gone: dict[str, str]) -> None:
        """A deleted pod leaves the API server once it has stopped (its grace period, as a cluster keeps it while
        terminating): its stored object goes, and with it the notary's trust in its token. A pod of the same name
        created since (another uid) stays."""
        if self.supervisor is not None:
            await self.supervisor.wait_gone(list(gone))
        for name, uid in gone.items():
            path = self.run_dir / "pods" / name / POD_FILE
            try:
                if json.loads(path.read_text())["metadata"].get("uid") == uid:
                    path.unlink()
            except (OSError, ValueError, KeyError):
                pass

    # --- the runner's side of the control directory -------------------------------------------------------
    async def serve(self, supervisor) -> None:
        """Answer scale requests until cancelled (the run ends)."""
        self.supervisor = supervisor
        control = self.run_dir / CONTROL
        control.mkdir(parents=True, exist_ok=True)
        registration = register(self.run_dir)
        loop = asyncio.get_running_loop()
        try:
            while True:
                for path in sorted(control.glob("scale-*.request.json")):
                    try:
                        answer = await self.handle(path, supervisor, loop, restart_policy)
                    except Exception as e:  # noqa: BLE001 - the command must hear why instead of timing out
                        supervisor.output.line(b"", f"trainhook local: the scale failed: {e}".encode())
                        answer = {"ok": False, "message": f"error: the scale failed: {e}"}
                    write_json_atomically(path.with_name(path.name.replace(".request", ".answer")), answer)
                    path.unlink(missing_ok=True)
                await asyncio.sleep(POLL)
        finally:
            registration.unlink(missing_ok=True)
            (self.run_dir / CONTROL / RUNNER_FILE).unlink(missing_ok=True)

    async def handle(self, path: Path, supervisor, loop, restart_policy) -> dict:
        say = supervisor.output.line
        try:
            request = json.loads(path.read_text())
            if "pod" in request:
                return await self.delete(str(request["pod"]), str(request["namespace"]), supervisor, loop,
                                         restart_policy)
            name, namespace, replicas = str(request["name"]), str(request["namespace"]), int(request["replicas"])
            if replicas < 0:
                raise ValueError("replicas must be 0 or more")
        except (OSError, ValueError, KeyError, TypeError) as e:
            return {"ok": False, "message": f"error: a malformed scale request ({e})"}
        try:
            sts, create, delete = self.accept(name, namespace, replicas)
        except ScaleRefused as e:
            say(b"", f"trainhook local: refused a scale of statefulset/{name} to {replicas}: {e}".encode())
            return {"ok": False, "message": str(e)}
        work = [f"deleting pod {n}" for n in delete] + [f"creating pod {name}-{i}" for i in create]
        say(b"", f"trainhook local: statefulset/{name} scaled to {replicas}: {', '.join(work) or 'no change'}"
                 .encode())
        for pod_name in delete:
            supervisor.delete_pod(pod_name)
        if delete:
            self.forget(delete)
        await supervisor.wait_gone([f"{name}-{i}" for i in create])  # a reused name: the old pod goes first
        pods, failures = await loop.run_in_executor(None, self.create, sts, create)
        for message in failures:
            say(b"", f"trainhook local: {message}".encode())
        for pod in pods:
            await supervisor.add_pod(pod, restart_policy(self.run_dir / "pods" / pod.name))
        return {"ok": True, "message": f"statefulset.apps/{name} scaled", "warnings": failures}


    async def delete(self, name: str, namespace: str, supervisor, loop, restart_policy) -> dict:
        """`kubectl delete pod`: the kubelet stops it (SIGTERM, grace, SIGKILL); a StatefulSet's controller then
        creates it again, through admission, once the old one is gone (a pod replaced after an eviction)."""
        pod = next((p for p in self.state.pods if p["metadata"]["name"] == name
                    and p["metadata"].get("namespace") == namespace), None)
        if pod is None:
            return {"ok": False, "message": f'Error from server (NotFound): pods "{name}" not found'}
        owner = next((r.get("name") for r in pod["metadata"].get("ownerReferences") or []
                      if r.get("kind") == "StatefulSet"), None)
        supervisor.output.line(b"", f"trainhook local: pod {name} deleted".encode()
                               + (f"; StatefulSet {owner} will create it again".encode() if owner else b""))
        supervisor.delete_pod(name)
        self.forget([name])
        if owner is not None:
            sts = find_statefulset(self.state.workloads, owner, namespace)
            create, _ = plan(ordinals(self.state.pods, owner), int(sts["spec"].get("replicas", 1)))
            await supervisor.wait_gone([name])
            pods, failures = await loop.run_in_executor(None, self.create, sts, create)
            for message in failures:
                supervisor.output.line(b"", f"trainhook local: {message}".encode())
            for new in pods:
                await supervisor.add_pod(new, restart_policy(self.run_dir / "pods" / new.name))
        return {"ok": True, "message": f'pod "{name}" deleted'}


def register(run_dir: Path) -> Path:
    """Say where this runner is: RUN_DIR/control/runner.json, and the registry entry `scale` looks in."""
    info = {"pid": os.getpid(), "runDir": str(run_dir.resolve())}
    write_json_atomically(run_dir / CONTROL / RUNNER_FILE, info)
    entry = REGISTRY / f"{os.getpid()}.json"
    try:
        REGISTRY.mkdir(parents=True, exist_ok=True)
        write_json_atomically(entry, info)
    except OSError:
        pass  # only the RUN_DIR-less form of `scale` needs it
    return entry


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def live_runs() -> list[Path]:
    """The run directories of the local runs alive now."""
    runs = []
    for entry in sorted(REGISTRY.glob("*.json")) if REGISTRY.is_dir() else []:
        try:
            info = json.loads(entry.read_text())
        except (OSError, ValueError):
            continue
        if alive(int(info.get("pid", 0))):
            runs.append(Path(info["runDir"]))
    return runs
