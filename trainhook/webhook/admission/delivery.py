"""Deliver the launcher into a gang pod and wrap its training command (docs/use/delivery.md).

Gang completion, gang failure, restart-gang, the deadline, the outcome on the workload and scale-to-zero all
happen in `trainhook-launch run` inside the training container, and the users' images do not contain it. So,
as Argo's emissary and Tekton's entrypoint do, the pod gets an emptyDir (keys.LAUNCHER_VOLUME) that the
injected init container fills first (`trainhook-launch wait --install`), mounted read-only at keys.LAUNCHER_DIR
in the training container, whose command becomes `/trainhook/bin/trainhook-launch run -- <its command>`
(`args` untouched). MPI pods get the MPI commands instead: `mpirun --` on the launcher (and on every pod of a
gang without a launcher role, where pod 0 launches), `mpi-worker` on a launcher's workers.

A command that already runs trainhook-launch (the user wrote it, or this is a second admission) is pointed at
the delivered copy and not wrapped again. A training container without `command` would run its image's
ENTRYPOINT, which admission cannot know without a registry call: it is refused unless the annotation
keys.ENTRYPOINT gives it (an MPI worker has nothing of its own to run, so it needs neither). `keys.LAUNCHER:
none` opts the gang out of all of this.

The delivered launcher also gets the pod's identity for the notary (docs/operate/security.md), and only it: a
projected ServiceAccount token of audience keys.IDENTITY_AUDIENCE in the volume keys.IDENTITY_VOLUME, mounted
read-only at keys.IDENTITY_DIR in the training container, and the notary's URL and CA bundle in its environment
(`identity_env`). The kubelet writes and refreshes the token; nothing secret is in the pod spec.
"""

from __future__ import annotations

import json
import posixpath
import shlex

from trainhook.gang import keys
from trainhook.launcher.deliver import SHIM_NAME, ZIP_NAME
from trainhook.webhook.admission.frameworks import launcher_words
from trainhook.webhook.admission.member import Member, Problems, Shape

MOUNT = {"name": keys.LAUNCHER_VOLUME, "mountPath": keys.LAUNCHER_DIR, "readOnly": True}
WRAP_EXAMPLE = '["python", "train.py"]'

# The launcher ConfigMap that webhook/launcher_configmap.py keeps in each training namespace: its name's prefix, its
# keys (ConfigMap keys cannot hold a '/': the volume's items map them), and the volume that mounts it. They live here
# because admission decides each pod's launcher volume, with no I/O.
LAUNCHER_CONFIGMAP_PREFIX = "trainhook-launcher-"
ZIP_KEY, SHIM_KEY = ZIP_NAME, SHIM_NAME


def launcher_configmap_volume(name: str) -> dict:
    """The pod's launcher volume: the zip and bin/trainhook-launch, as the init container lays them out."""
    return {"name": keys.LAUNCHER_VOLUME, "configMap": {"name": name, "items": [
        {"key": ZIP_KEY, "path": ZIP_KEY, "mode": 0o444},
        {"key": SHIM_KEY, "path": f"bin/{SHIM_KEY}", "mode": 0o555}]}}


def is_our_launcher_volume(volume_spec: dict) -> bool:
    """Whether a volume named keys.LAUNCHER_VOLUME is the one we deliver (an emptyDir, or our ConfigMap)."""
    if volume_spec.get("emptyDir") is not None:
        return True
    source = volume_spec.get("configMap")
    return isinstance(source, dict) and str(source.get("name", "")).startswith(LAUNCHER_CONFIGMAP_PREFIX)


def launcher_mode(annotations: dict, problems: Problems) -> str:
    mode = annotations.get(keys.LAUNCHER, keys.LAUNCHER_DELIVERED)
    if mode not in keys.LAUNCHER_MODES:
        problems.add(keys.LAUNCHER, mode, "unknown launcher mode", f"use one of {', '.join(keys.LAUNCHER_MODES)}")
        return keys.LAUNCHER_NONE
    return mode


def runs_launcher(command: object) -> bool:
    """Whether a command already starts trainhook-launch (by name on PATH, or the delivered copy)."""
    return (isinstance(command, list) and bool(command) and isinstance(command[0], str)
            and posixpath.basename(command[0]) == keys.LAUNCHER_PROGRAM)


def parse_entrypoint(text: object, problems: Problems) -> list[str] | None:
    """The entrypoint annotation's value: a JSON list of non-empty strings, as the contract says, else None (a
    problem is added). A plain string is refused, not taken as one word: `python -c 'print(1)'` would run as one
    program of that name and fail at run time (exit 127), where the refusal names the list to write instead."""
    value = None
    if isinstance(text, str) and text.lstrip().startswith("["):
        try:
            value = json.loads(text)
        except ValueError:
            pass
    if isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):
        return value
    if isinstance(text, str) and text.strip() and not text.lstrip().startswith("["):
        try:
            words = shlex.split(text)
        except ValueError:
            words = []
        example = json.dumps(words) if words else WRAP_EXAMPLE
        problems.add(keys.ENTRYPOINT, text, "not an entrypoint: a plain string, which would run as one program of "
                     "that name", f"write the image's ENTRYPOINT as a JSON list of strings, e.g. {example}")
        return None
    problems.add(keys.ENTRYPOINT, text, "not an entrypoint",
                 f"give the image's ENTRYPOINT as a JSON list of strings, e.g. {WRAP_EXAMPLE}")
    return None


def entrypoint(container: dict, annotations: dict, problems: Problems) -> list[str] | None:
    """The command the training container runs: its `command`, else the entrypoint annotation, else None (a
    problem is added)."""
    command = container.get("command")
    if command:
        return list(command)
    text = annotations.get(keys.ENTRYPOINT)
    name = container.get("name", "")
    if text is None:
        problems.add(f"spec.containers[{name}].command", None,
                     "the training command cannot be wrapped in trainhook-launch: without `command` the container "
                     "runs its image's ENTRYPOINT, which admission cannot read (that needs a registry call)",
                     f"set `command` (the image's entrypoint, e.g. {WRAP_EXAMPLE}), or give the entrypoint in the "
                     f"annotation {keys.ENTRYPOINT}, or opt out with {keys.LAUNCHER}: none")
        return None
    return parse_entrypoint(text, problems)


def needs_no_command(framework: str, role: str, shape: Shape) -> bool:
    """An MPI launcher's workers have nothing of their own to run (they host mpirun's daemons)."""
    return launcher_words(framework, role, shape)[0] == "mpi-worker"


def check_template(template: dict, framework: str, role: str, shape: Shape, problems: Problems) -> None:
    """At `kubectl apply` of a StatefulSet or Job: what its pods would be refused for (no command to wrap, a bad
    launcher mode or entrypoint), so it is said once, before the controller's FailedCreate events."""
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    if keys.ENTRYPOINT in annotations:  # a bad value is refused wherever it is, used or not (the contract's list)
        parse_entrypoint(annotations[keys.ENTRYPOINT], problems)
    if keys.LAUNCHER in annotations and launcher_mode(annotations, problems) == keys.LAUNCHER_NONE:
        return
    containers = (template.get("spec") or {}).get("containers") or []
    wanted = annotations.get(keys.CONTAINER)
    container = next((c for c in containers if c.get("name") == wanted), None) if wanted else \
        (containers[0] if containers else None)
    if container is None or container.get("command"):
        return  # a missing container is the pod's refusal to name
    if not needs_no_command(framework, role, shape) and keys.ENTRYPOINT not in annotations:
        entrypoint(container, annotations, problems)


def wrapped(command: list[str] | None, member: Member) -> list[str]:
    """The training container's new command: the delivered launcher, its subcommand, then the command."""
    if command is not None and runs_launcher(command):
        return [keys.LAUNCHER_COMMAND, *command[1:]]
    words = launcher_words(member.framework, member.role, member.shape)
    if not command:  # an MPI worker with nothing of its own to run
        return [keys.LAUNCHER_COMMAND, words[0]]
    return [keys.LAUNCHER_COMMAND, *words, *command]


def mount_launcher(container: dict) -> None:
    """Mount the launcher volume read-only at LAUNCHER_DIR (once; a new list, the review's stays as it was)."""
    mounts = container.get("volumeMounts") or []
    if not any(m.get("mountPath", "").rstrip("/") == keys.LAUNCHER_DIR for m in mounts):
        container["volumeMounts"] = mounts + [dict(MOUNT)]


def add_volume(spec: dict, configmap: str | None) -> None:
    """The launcher volume: the ConfigMap `configmap` where the namespace has one, else an emptyDir that the
    init container fills. One that an earlier admission added stays as it is."""
    volumes = spec.get("volumes") or []
    if not any(v.get("name") == keys.LAUNCHER_VOLUME for v in volumes):
        new = launcher_configmap_volume(configmap) if configmap else {"name": keys.LAUNCHER_VOLUME, "emptyDir": {}}
        spec["volumes"] = volumes + [new]


def delivered_by_configmap(spec: dict) -> bool:
    """Whether the pod's launcher volume is a ConfigMap (then no init container is needed to fill it)."""
    return any(v.get("name") == keys.LAUNCHER_VOLUME and v.get("configMap") is not None
               for v in spec.get("volumes") or [])


def user_volume_clash(spec: dict, container: dict, problems: Problems) -> bool:
    """A user's own volume under our name, or the training container's own mount at our path, would hide the
    launcher: say so."""
    for volume in spec.get("volumes") or []:
        if volume.get("name") == keys.LAUNCHER_VOLUME and not is_our_launcher_volume(volume):
            problems.add("spec.volumes", keys.LAUNCHER_VOLUME, "the name of the volume trainhook delivers its "
                         "launcher in", f"rename your volume, or opt out with {keys.LAUNCHER}: none")
            return True
    for mount in container.get("volumeMounts") or []:
        if mount.get("mountPath", "").rstrip("/") == keys.LAUNCHER_DIR and mount.get("name") != keys.LAUNCHER_VOLUME:
            problems.add(f"spec.containers[{container.get('name', '')}].volumeMounts", keys.LAUNCHER_DIR,
                         "the path trainhook delivers its launcher to", f"mount your volume elsewhere, or opt out "
                         f"with {keys.LAUNCHER}: none")
            return True
    return False


IDENTITY_TOKEN_PATH = "token"
IDENTITY_EXPIRATION_SECONDS = 3600  # the kubelet refreshes the token at 80% of this; the launcher re-reads it
IDENTITY_SOURCE = {"serviceAccountToken": {"audience": keys.IDENTITY_AUDIENCE,
                                           "expirationSeconds": IDENTITY_EXPIRATION_SECONDS,
                                           "path": IDENTITY_TOKEN_PATH}}
IDENTITY_MOUNT = {"name": keys.IDENTITY_VOLUME, "mountPath": keys.IDENTITY_DIR, "readOnly": True}


def is_identity_volume(volume: dict) -> bool:
    """Whether a volume of our name is the one we inject (the API server may have defaulted `defaultMode`)."""
    return (volume.get("projected") or {}).get("sources") == [IDENTITY_SOURCE]


def identity_clash(spec: dict, container: dict, problems: Problems) -> bool:
    """A user's own volume under the identity volume's name, or the training container's own mount at its
    path, would hide or replace the token the launcher presents to the notary: say so (nothing is overwritten)."""
    for volume in spec.get("volumes") or []:
        if volume.get("name") == keys.IDENTITY_VOLUME and not is_identity_volume(volume):
            problems.add("spec.volumes", keys.IDENTITY_VOLUME, "the name of the volume trainhook mounts the pod's "
                         "identity token from (for the notary)", f"rename your volume, or opt out with "
                         f"{keys.LAUNCHER}: none")
            return True
    for mount in container.get("volumeMounts") or []:
        if mount.get("mountPath", "").rstrip("/") == keys.IDENTITY_DIR and mount.get("name") != keys.IDENTITY_VOLUME:
            problems.add(f"spec.containers[{container.get('name', '')}].volumeMounts", keys.IDENTITY_DIR,
                         "the path trainhook mounts the pod's identity token at (for the notary)",
                         f"mount your volume elsewhere, or opt out with {keys.LAUNCHER}: none")
            return True
    return False


def give_identity(spec: dict, container: dict, problems: Problems) -> bool:
    """Add the identity volume and its read-only mount in the training container, each only where it is not
    there yet (so a second admission changes nothing). False, with the problem added, on a clash."""
    if ("volumes" in spec or "volumeMounts" in container) and identity_clash(spec, container, problems):
        return False
    volumes = spec.get("volumes") or []
    if not any(v.get("name") == keys.IDENTITY_VOLUME for v in volumes):
        spec["volumes"] = volumes + [{"name": keys.IDENTITY_VOLUME, "projected": {"sources": [
            {"serviceAccountToken": dict(IDENTITY_SOURCE["serviceAccountToken"])}]}}]
    mounts = container.get("volumeMounts") or []
    if not any(m.get("name") == keys.IDENTITY_VOLUME for m in mounts):
        container["volumeMounts"] = mounts + [dict(IDENTITY_MOUNT)]
    return True


def identity_env(notary_url: str, notary_ca: str) -> list[tuple[str, str]]:
    """Where the launcher finds the notary: its URL and the CA bundle that verifies it (public, not secret)."""
    return [(keys.TH_NOTARY, notary_url), (keys.TH_NOTARY_CA, notary_ca)]


def resolve_other_containers(spec: dict, training: dict) -> None:
    """Init containers and sidecars that call trainhook-launch themselves get the delivered copy too (after the
    copy: the injected init container runs first). Each one changed is a new dict; the others stay shared."""
    for field in ("initContainers", "containers"):
        current = spec.get(field)
        if not current:
            continue
        updated = None
        for i, c in enumerate(current):
            command = c.get("command") if c is not training else None
            if (command and runs_launcher(command) and command[0] != keys.LAUNCHER_COMMAND
                    and c.get("name") != keys.GANG_WAIT_CONTAINER):
                updated = updated or list(current)
                c = updated[i] = dict(c)
                c["command"] = [keys.LAUNCHER_COMMAND, *command[1:]]
                mount_launcher(c)
        if updated is not None:
            spec[field] = updated


def deliver_launcher(spec: dict, container: dict, member: Member, annotations: dict, problems: Problems,
                     configmap: str | None = None) -> bool:
    """Wrap the training container's command in the delivered launcher and give the pod the launcher volume
    (the ConfigMap `configmap` when given: webhook/launcher_configmap.py). Returns whether the launcher is
    delivered (into an emptyDir, the init container must then install it). Idempotent."""
    # Every pod of every gang comes through here: the checks that rarely apply are guarded by what they need.
    if keys.ENTRYPOINT in annotations and container.get("command"):  # unused, but refused as at the workload
        parse_entrypoint(annotations[keys.ENTRYPOINT], problems)
    if keys.LAUNCHER in annotations and launcher_mode(annotations, problems) == keys.LAUNCHER_NONE:
        return False
    if ("volumes" in spec or "volumeMounts" in container) and user_volume_clash(spec, container, problems):
        return False
    command = container.get("command") or None
    if command is None:
        if not needs_no_command(member.framework, member.role, member.shape) or keys.ENTRYPOINT in annotations:
            command = entrypoint(container, annotations, problems)
            if command is None:
                return False
    new_command = wrapped(command, member)
    if container.get("command") != new_command:
        container["command"] = new_command
    mount_launcher(container)
    add_volume(spec, configmap)
    if "initContainers" in spec or len(spec["containers"]) > 1:
        resolve_other_containers(spec, container)
    return True
