"""Expected objects for the table-driven mutation tests: what the webhook should return, written out plainly
(never computed by the webhook's own code), shared by every framework's tests."""

from __future__ import annotations

import copy

from trainhook.gang import keys

LAUNCHER_IMAGE = "registry.example/launcher:1"
WAIT_TIMEOUT = "300"


def env(**values: str) -> list[dict]:
    return [{"name": k, "value": v} for k, v in values.items()]


def gang_env(framework: str, job: str, role: str, index: int, rank: int, replicas: str, hosts: str,
             subdomain: str, address: str, port: str | None = None, wait: str = "none") -> dict:
    """The TRAINHOOK_* variables of one member, in the order the webhook injects them. `wait`: the gang wait's mode,
    `none` by default where the launcher is delivered (its barrier waits), `dns` by default without it."""
    return dict(TRAINHOOK_FRAMEWORK=framework, TRAINHOOK_JOB_NAME=job, TRAINHOOK_NAMESPACE="team-a",
                TRAINHOOK_ROLE=role, TRAINHOOK_INDEX=str(index), TRAINHOOK_RANK=str(rank),
                TRAINHOOK_REPLICAS=replicas, TRAINHOOK_HOSTS=hosts, TRAINHOOK_SUBDOMAIN=subdomain,
                TRAINHOOK_ADDRESS=address, TRAINHOOK_PORT=port or str(keys.DEFAULT_PORT[framework]),
                TRAINHOOK_GANG_WAIT=wait, TRAINHOOK_GANG_WAIT_PORT="29499", TRAINHOOK_WAIT_TIMEOUT=WAIT_TIMEOUT)


LAUNCHER = "/trainhook/bin/trainhook-launch"
LAUNCHER_VOLUME = {"name": "trainhook-launcher", "emptyDir": {}}
LAUNCHER_MOUNT = {"name": "trainhook-launcher", "mountPath": "/trainhook", "readOnly": True}


def wait_container(gang: dict, deliver: bool = True) -> dict:
    """The injected init container: delivers the launcher into its volume, then waits for the gang. It passes
    Pod Security's restricted profile."""
    container = {"name": "trainhook-gang-wait", "image": LAUNCHER_IMAGE,
                 "command": ["trainhook-launch", "wait"] + (["--install", "/trainhook"] if deliver else []),
                 "env": env(**gang),
                 "resources": {"requests": {"cpu": "10m", "memory": "32Mi"},
                               "limits": {"cpu": "1", "memory": "128Mi"}},
                 "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "runAsUser": 65532,
                                     "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]},
                                     "seccompProfile": {"type": "RuntimeDefault"}}}
    if deliver:
        container["volumeMounts"] = [{"name": "trainhook-launcher", "mountPath": "/trainhook"}]
    return container


def delivered(pod: dict, words: tuple[str, ...] = ("run", "--")) -> dict:
    """The training container (the first) runs its command under the delivered launcher, which it mounts
    read-only; the pod has the launcher's emptyDir."""
    container = pod["spec"]["containers"][0]
    container["command"] = [LAUNCHER, *words, *(container.get("command") or [])]
    container["volumeMounts"] = (container.get("volumeMounts") or []) + [dict(LAUNCHER_MOUNT)]
    pod["spec"]["volumes"] = (pod["spec"].get("volumes") or []) + [dict(LAUNCHER_VOLUME)]
    return pod


def lifecycle_env(pod: dict, **annotated: str) -> dict:
    """TRAINHOOK_WORKLOAD (the pod's controller, `Pod/<name>` for a bare pod), TRAINHOOK_RESTART_POLICY, and the
    lifecycle annotations given (e.g. TRAINHOOK_ON_FAILURE="restart-gang")."""
    owners = pod["metadata"].get("ownerReferences") or []
    workload = f"{owners[0]['kind']}/{owners[0]['name']}" if owners else f"Pod/{pod['metadata']['name']}"
    return {"TRAINHOOK_WORKLOAD": workload,
            "TRAINHOOK_RESTART_POLICY": pod["spec"].get("restartPolicy", "Always"), **annotated}


def wired(pod: dict, framework_env: dict, gang: dict, user_env: list | None = None,
          words: tuple[str, ...] = ("run", "--"), **spec: object) -> dict:
    """`pod` as the webhook should return it: injected env first (the framework's, the gang's, the lifecycle's),
    the user's after, the command under the delivered launcher, the gang wait (and the delivery) in init."""
    pod = copy.deepcopy(pod)
    pod["spec"]["containers"][0]["env"] = env(**framework_env, **gang, **lifecycle_env(pod)) + (user_env or [])
    delivered(pod, words)
    pod["spec"]["initContainers"] = [wait_container(gang)]
    pod["spec"].update(spec)
    return pod


def stamped(obj: dict, replicas: str, role: str = "worker", job: str | None = None,
            subdomain: str | None = None) -> dict:
    """A workload as the webhook returns it: identity and shape on the template (and a Job's subdomain)."""
    obj = copy.deepcopy(obj)
    meta = obj["spec"]["template"]["metadata"]
    meta["labels"].update({"trainhook.dev/job-name": job or obj["metadata"]["name"], "trainhook.dev/role": role})
    meta.setdefault("annotations", {})["trainhook.dev/replicas"] = replicas
    if subdomain:
        obj["spec"]["template"]["spec"]["subdomain"] = subdomain
    return obj
