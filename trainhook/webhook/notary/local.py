"""The notary's authority under `trainhook local`: the runner's files play the API server (docs/operate/security.md,
"`trainhook local`").

In a cluster the notary asks the API server who a token names (TokenReview) and reads pods and workloads; a local
run has no API server, but its runner writes the same facts as files, and this authority reads them:

  RUN_DIR/notary/tokens/<sha256 of a token>   {"namespace", "pod", "uid", "serviceAccount", "audience"}: written by
                                               the runner (the kubelet's part) for each projected token it issues
  RUN_DIR/pods/<pod>/pod.json                  a pod as stored (uid, labels, ownerReferences, spec); removed when
                                               the pod is deleted (a scale-down, `trainhook local delete`)
  RUN_DIR/notary/workloads/<ns>/<Kind>/<name>.json   the StatefulSets and Jobs as stored, with a resourceVersion;
                                               the notary's records (annotations, the phase label, a scale to 0)
                                               are merge-patched into them
  RUN_DIR/notary/events/<ns>/<name>.json       the Events the notary creates (a name that exists: a retry)

The decision is the notary's own (webhook/notary/service.py with the pure notary_membership): only the I/O differs, and
nothing here is kinder than the cluster's answers. A token is good for the pod it was issued to while that pod's
record (with that uid) exists; a token the runner never issued authenticates nothing. The gang's outcome as
`trainhook local` shows it still comes from the launchers' status files (trainhook/local/results.py); the records
here are what `kubectl describe` would show in a cluster.

Writers of a workload file (this authority, in the webhook process, and the runner's `scale`) take an exclusive
flock on RUN_DIR/notary/workloads/.lock around each read-modify-write, so neither loses the other's change.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

from trainhook.gang import keys
from trainhook.webhook.notary.membership import POD_NAME_EXTRA, POD_UID_EXTRA, WORKLOAD_KINDS
from trainhook.launcher.files import write_json_atomically

NOTARY_DIR = "notary"
TOKENS, WORKLOADS, EVENTS = "tokens", "workloads", "events"
POD_FILE = "pod.json"  # trainhook/local/state.py writes it (build_local_pod)
LOCK = ".lock"


class LocalConflict(Exception):
    """A write's resourceVersion precondition failed (webhook/notary/service.py maps it to its Conflict)."""


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _safe_name(value: str, what: str) -> str:
    """A path component from a request (namespace, name, kind): never a path of its own."""
    if not value or "/" in value or value in (".", "..") or "\0" in value:
        raise ValueError(f"{what} {value!r} is not a valid name")
    return value


def workload_path(run_dir: Path, namespace: str, kind: str, name: str) -> Path:
    return (run_dir / NOTARY_DIR / WORKLOADS / _safe_name(namespace, "namespace") / _safe_name(kind, "kind")
            / f"{_safe_name(name, 'name')}.json")


@contextlib.contextmanager
def workloads_locked(run_dir: Path) -> Iterator[None]:
    root = run_dir / NOTARY_DIR / WORKLOADS
    root.mkdir(parents=True, exist_ok=True)
    with open(root / LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)




def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def store_workloads(run_dir: Path, workloads: list[dict]) -> None:
    """The runner's part: keep the stored StatefulSets and Jobs where the notary reads them (resourceVersion 1)."""
    with workloads_locked(run_dir):
        for workload in workloads:
            if workload.get("kind") not in WORKLOAD_KINDS:
                continue
            meta = workload["metadata"]
            stored = copy.deepcopy(workload)
            stored["metadata"]["resourceVersion"] = "1"
            path = workload_path(run_dir, meta.get("namespace", "default"), workload["kind"], meta["name"])
            write_json_atomically(path, stored, indent=1)


def merge_patch(target: object, patch: dict) -> dict:
    """RFC 7386 JSON merge patch, as the API server applies `application/merge-patch+json`: an object's keys
    merged in (a None removes one), any other value replacing what was there."""
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value) if isinstance(value, dict) else copy.deepcopy(value)
    return result


def patch_stored_workload(run_dir: Path, namespace: str, kind: str, name: str, patch: dict) -> dict | None:
    """Merge-patch a stored workload under the lock; its resourceVersion, when the patch names one, must be the
    current one (LocalConflict). Returns the workload as stored now, or None when there is none."""
    path = workload_path(run_dir, namespace, kind, name)
    with workloads_locked(run_dir):
        current = _read_json(path)
        if current is None:
            return None
        version = current.get("metadata", {}).get("resourceVersion", "1")
        wanted = ((patch.get("metadata") or {}).get("resourceVersion")) if isinstance(patch, dict) else None
        if wanted is not None and wanted != version:
            raise LocalConflict(f"{kind}/{name}: resourceVersion {wanted} is not the current {version}")
        updated = merge_patch(current, patch)
        updated["metadata"]["resourceVersion"] = str(int(version) + 1)
        write_json_atomically(path, updated, indent=1)
        return updated


class LocalAuthority:
    """webhook.notary.Authority over a local run's files (the module docstring lists them)."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        if not self.run_dir.is_dir():
            raise ValueError(f"--notary-authority local:{run_dir}: no such directory (the trainhook local run's "
                             "directory, where it writes its pods and tokens)")

    # --- who a token names: the runner recorded every token it issued ----------------------------------------
    async def review_token(self, token: str) -> dict:
        record = _read_json(self.run_dir / NOTARY_DIR / TOKENS / token_digest(token))
        if record is None:
            return {"authenticated": False, "error": "no pod of this run was issued this token"}
        if record.get("audience") != keys.IDENTITY_AUDIENCE:
            return {"authenticated": False,
                    "error": f"the token is for audience {record.get('audience')!r}, not {keys.IDENTITY_AUDIENCE}"}
        return {"authenticated": True, "audiences": [keys.IDENTITY_AUDIENCE],
                "user": {"username": f"system:serviceaccount:{record.get('namespace')}:"
                                     f"{record.get('serviceAccount') or 'default'}",
                         "extra": {POD_NAME_EXTRA: [record.get("pod", "")], POD_UID_EXTRA: [record.get("uid", "")]}}}

    # --- reads ------------------------------------------------------------------------------------------------
    def _pods(self) -> Iterator[dict]:
        for path in sorted((self.run_dir / "pods").glob(f"*/{POD_FILE}")):
            pod = _read_json(path)
            if pod is not None:
                yield pod

    async def get_pod(self, namespace: str, name: str) -> dict | None:
        try:
            pod = _read_json(self.run_dir / "pods" / _safe_name(name, "pod name") / POD_FILE)
        except ValueError:
            return None
        if pod is None or (pod.get("metadata") or {}).get("namespace") != namespace:
            return None
        return pod

    async def list_gang_pods(self, namespace: str, job: str) -> list[dict]:
        return [pod for pod in self._pods() if (pod.get("metadata") or {}).get("namespace") == namespace
                and ((pod["metadata"].get("labels") or {}).get(keys.JOB_NAME) == job)]

    async def get_workload(self, namespace: str, kind: str, name: str) -> dict | None:
        try:
            return _read_json(workload_path(self.run_dir, namespace, kind, name))
        except ValueError:
            return None

    # --- writes -----------------------------------------------------------------------------------------------
    async def patch_workload(self, namespace: str, kind: str, name: str, patch: dict) -> None:
        from trainhook.webhook.notary.authority import Conflict, Unreachable

        try:
            stored = patch_stored_workload(self.run_dir, namespace, kind, name, patch)
        except LocalConflict as e:
            raise Conflict(str(e)) from None
        if stored is None:
            raise Unreachable(f"{kind}/{name} is gone")

    async def scale_to_zero(self, namespace: str, name: str) -> None:
        """Recorded on the stored StatefulSet; the runner does not act on it (its parked launchers end the run)."""
        patch_stored_workload(self.run_dir, namespace, "StatefulSet", name, {"spec": {"replicas": 0}})

    async def create_event(self, namespace: str, body: dict) -> None:
        name = _safe_name(str((body.get("metadata") or {}).get("name", "")), "event name")
        path = self.run_dir / NOTARY_DIR / EVENTS / _safe_name(namespace, "namespace") / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(path, "x") as f:  # exists already: this record's Event, retried
                json.dump(body, f, indent=1)
        except FileExistsError:
            pass


def stored_events(run_dir: Path) -> list[dict]:
    """Every Event the notary created in a run, oldest first (for the runner and the tests)."""
    events = [e for e in (_read_json(p) for p in (run_dir / NOTARY_DIR / EVENTS).glob("*/*.json")) if e]
    return sorted(events, key=lambda e: (e.get("firstTimestamp", ""), e["metadata"]["name"]))
