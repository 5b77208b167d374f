"""Pod volumes as host directories, and each container's mounts, as the kubelet prepares them.

configMap and secret volumes are written into a per-pod directory (read-only mounts, as the kubelet makes
them); emptyDir is an empty per-pod directory; persistentVolumeClaim (StatefulSet volumeClaimTemplates) is a
per-claim directory that lives as long as the run; hostPath is the host path itself.

Each volume's directory has the mode a kubelet gives it, not this machine's umask: emptyDir and configMap
0777, secret 1777 (its tmpfs). A program that checks modes (sshd's StrictModes refuses a world-writable
~/.ssh, so a Secret of keys mounted at /root/.ssh fails there) must fail here as it would in a pod.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from trainhook.local.envvars import EnvError, Sources, source_bytes

# The modes of a volume's own directory on a kubelet (measured on the e2e node: `stat` in a pod).
EMPTY_DIR_MODE, CONFIG_MAP_DIR_MODE, SECRET_DIR_MODE = 0o777, 0o777, 0o1777


@dataclass(frozen=True)
class Mount:
    """A bind mount: `source` on the host appears at `target` inside the container."""

    source: str
    target: str
    read_only: bool = False

    def to_arg(self) -> str:
        """The `--mount` argument of podinit: SRC:DST, or SRC:DST:ro."""
        return f"{self.source}:{self.target}" + (":ro" if self.read_only else "")


def _safe_relative(path: str, what: str) -> PurePosixPath:
    rel = PurePosixPath(path)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise EnvError(f"{what} {path!r} must be a relative path without '..'")
    return rel


def _write_items(root: Path, data: dict[str, bytes], source: dict, what: str) -> None:
    root.mkdir(parents=True, exist_ok=True)
    mode = int(source.get("defaultMode", 0o644))
    items = source.get("items")
    chosen = [(i["key"], i.get("path", i["key"]), int(i.get("mode", mode))) for i in items] if items else \
        [(k, k, mode) for k in data]
    for key, path, item_mode in chosen:
        if key not in data:
            if source.get("optional"):
                continue
            raise EnvError(f"{what}: key {key!r} not found")
        target = root / _safe_relative(path, f"{what} item path")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data[key])
        target.chmod(item_mode)


@dataclass(frozen=True)
class Volume:
    path: Path
    read_only: bool  # configMap and secret volumes are always mounted read-only


def prepare_volumes(pod: dict, pod_dir: Path, claims_dir: Path, sources: Sources) -> dict[str, Volume]:
    """Materialize the pod's volumes under `pod_dir`; returns name -> host path."""
    namespace = pod["metadata"]["namespace"]
    volumes: dict[str, Volume] = {}
    for spec in (pod.get("spec") or {}).get("volumes") or []:
        name = spec.get("name", "")
        what = f"volume {name!r}"
        root = pod_dir / "volumes" / name
        if "emptyDir" in spec:
            root.mkdir(parents=True, exist_ok=True)
            root.chmod(EMPTY_DIR_MODE)
            volumes[name] = Volume(root, False)
        elif "configMap" in spec or "secret" in spec:
            kind, key, name_field = ("ConfigMap", "configMap", "name") if "configMap" in spec else \
                ("Secret", "secret", "secretName")
            source = spec[key] or {}
            table = sources.configmaps if kind == "ConfigMap" else sources.secrets
            obj = table.get((namespace, source.get(name_field, "")))
            if obj is None and not source.get("optional"):
                raise EnvError(f'{what}: {kind.lower()} "{source.get(name_field)}" not found in namespace '
                               f"{namespace!r} (add it to the manifest)")
            _write_items(root, source_bytes(kind, obj) if obj else {}, source, what)
            root.chmod(CONFIG_MAP_DIR_MODE if kind == "ConfigMap" else SECRET_DIR_MODE)
            volumes[name] = Volume(root, True)
        elif "persistentVolumeClaim" in spec:
            claim = spec["persistentVolumeClaim"].get("claimName", name)
            path = claims_dir / namespace / claim
            path.mkdir(parents=True, exist_ok=True)
            volumes[name] = Volume(path, bool(spec["persistentVolumeClaim"].get("readOnly")))
        elif "projected" in spec:
            volumes[name] = Volume(_projected_tokens(spec["projected"] or {}, pod, root, what), True)
        elif "hostPath" in spec:
            volumes[name] = Volume(Path(spec["hostPath"].get("path", "")), False)
        else:
            kinds = sorted(set(spec) - {"name"})
            raise EnvError(f"{what}: {', '.join(kinds) or 'no source'} is not supported locally "
                           "(emptyDir, configMap, secret, persistentVolumeClaim, hostPath and projected "
                           "serviceAccountToken are)")
    return volumes


def _projected_tokens(projected: dict, pod: dict, root: Path, what: str) -> Path:
    """A projected volume of serviceAccountToken sources, as the kubelet writes it: here a random token per pod
    and source (the runner plays the API server that would issue it), recorded in RUN_DIR/notary/tokens under its
    SHA-256 with the pod it names, for the local notary authority (webhook/notary/local.py)."""
    root.mkdir(parents=True, exist_ok=True)
    meta = pod["metadata"]
    for source in projected.get("sources") or []:
        token_source = source.get("serviceAccountToken")
        if token_source is None:
            raise EnvError(f"{what}: projected sources other than serviceAccountToken are not supported locally")
        token = secrets.token_urlsafe(32)
        target = root / _safe_relative(token_source.get("path", ""), f"{what} serviceAccountToken path")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(token)
        target.chmod(0o644)
        record = {"namespace": meta["namespace"], "pod": meta["name"], "uid": meta.get("uid", ""),
                  "serviceAccount": (pod.get("spec") or {}).get("serviceAccountName") or "default",
                  "audience": token_source.get("audience") or "api"}
        tokens = root.parent.parent.parent.parent / "notary" / "tokens"  # RUN_DIR/pods/POD/volumes/NAME
        tokens.mkdir(parents=True, exist_ok=True)
        (tokens / hashlib.sha256(token.encode()).hexdigest()).write_text(json.dumps(record))
    return root


def container_mounts(container: dict, volumes: dict[str, Volume]) -> list[Mount]:
    """The container's volumeMounts as bind mounts, parents before children (as runtimes order them)."""
    mounts = []
    for vm in container.get("volumeMounts") or []:
        volume = volumes.get(vm.get("name", ""))
        if volume is None:
            raise EnvError(f"container {container.get('name')!r}: volumeMount {vm.get('name')!r} names no volume")
        target = vm.get("mountPath", "")
        if not target.startswith("/"):
            raise EnvError(f"container {container.get('name')!r}: mountPath {target!r} must be absolute")
        if ":" in target or ":" in str(volume.path):
            raise EnvError(f"container {container.get('name')!r}: mount paths with ':' are not supported locally "
                           f"({volume.path} on {target})")
        source = volume.path
        if vm.get("subPath"):
            source = source / _safe_relative(vm["subPath"], "subPath")
            if not source.exists():
                source.mkdir(parents=True)
        mounts.append(Mount(str(source), target, volume.read_only or bool(vm.get("readOnly"))))
    return sorted(mounts, key=lambda m: len(PurePosixPath(m.target).parts))
