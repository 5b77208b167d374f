"""Any image with Python, with or without a shell (issue 25 item 4, docs/use/delivery.md): on the real node, gangs
whose image has no /bin/sh, dash or bash (hack/images.py `noshell`: the Debian Python base with its shells removed,
as distroless and Chainguard Python images are) run under the delivered entry point, a static program, to
Succeeded; an image with neither shell nor Python (`bare`) fails at start with the one line naming the fix, exit 127,
in the container's log and state (no Python: nothing of trainhook can run there to record an outcome).

Both ways the launcher reaches a pod: the ConfigMap in a namespace of the chart's trainingNamespaces (`default`),
and the init container's emptyDir elsewhere (a fresh namespace). Before the entry point was a program, the
`noshell` gang's containers failed with "exec /trainhook/bin/trainhook-launch: no such file or directory" and
crash-looped with nothing naming the fix."""

from __future__ import annotations

import json
import time

import pytest

from e2e_gangs import NAMESPACE, delete_gang, phase_of, pods_of, statefulset, statefulset_gang
from e2e_helpers import LogFollower, shown_on_failure, wait_for
from trainhook.cluster.logs import KUBELET_NO_LOG
from trainhook.launcher import deliver

# The training proves it has no shell to lean on, and that it ran under the delivered launcher as a gang member.
SCRIPT = """
import os, shutil, time
missing = [s for s in ("sh", "bash", "dash") if shutil.which(s) or os.path.lexists("/bin/" + s)]
assert not missing, f"this image has a shell: {missing}"
rank = os.environ["TRAINHOOK_RANK"]
time.sleep(3)
print(f"rank {rank}: trained with no shell in the image", flush=True)
"""
NO_PYTHON = f"trainhook-launch: no python3 or python on PATH in this image; {deliver.FIX}"


def delivery_of(pod: dict) -> str:
    """How the launcher reached this pod: "configmap" or "init-container" (an emptyDir the init container fills)."""
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "trainhook-launcher"]
    inits = [c["name"] for c in pod["spec"].get("initContainers") or []]
    if "configMap" in volume:
        assert "trainhook-gang-wait" not in inits
        return "configmap"
    assert "emptyDir" in volume and "trainhook-gang-wait" in inits
    return "init-container"


@pytest.fixture(params=["configmap", "init-container"])
def where(request, node, release) -> tuple[str, str]:
    """(delivery, namespace): `default` is in the chart's trainingNamespaces; a fresh namespace is not."""
    if request.param == "configmap":
        return request.param, NAMESPACE
    return request.param, request.getfixturevalue("namespace")


def test_a_gang_on_an_image_with_python_and_no_shell_succeeds(node, where):
    delivery, namespace = where
    name = "e2e-noshell"
    delete_gang(node, name, namespace)
    followers: dict[str, LogFollower] = {}
    t0 = time.monotonic()
    try:
        node.apply(namespace, statefulset_gang(name, node.images["noshell"], ["python3", "-c", SCRIPT], 2))
        for i in range(2):
            followers[f"{name}-{i}"] = LogFollower(node, namespace, f"{name}-{i}", "trainer")
        with shown_on_failure(node, namespace, followers):
            pods = wait_for(lambda: len(pods_of(node, name, namespace)) == 2 and pods_of(node, name, namespace),
                            60, f"the pods of {name}")
            assert {delivery_of(p) for p in pods} == {delivery}

            def done():
                phase = phase_of(node, name, namespace)
                assert phase.get("trainhook.dev/phase") != "Failed", phase
                return phase.get("trainhook.dev/phase") == "Succeeded" and phase
            phase = wait_for(done, 120, f"{name} to record Succeeded", interval=1)
            wait_for(lambda: statefulset(node, name, namespace)["spec"]["replicas"] == 0, 30, "the scale to zero")
            wait_for(lambda: all(f"rank {i}: trained with no shell" in followers[f"{name}-{i}"].text
                                 for i in range(2)), 30, "both ranks' training lines")
        assert phase.get("trainhook.dev/exit-code", "0") == "0", phase
        for follower in followers.values():
            assert "no such file or directory" not in follower.text, follower.text[-2000:]
        print(f"{delivery}: the shell-less gang succeeded in {time.monotonic() - t0:.1f}s")
    finally:
        for follower in followers.values():
            follower.stop()
        delete_gang(node, name, namespace, wait=False)


def the_line_logged(node, namespace: str, pod: str) -> str | None:
    """The one line the trainer logs, from its current or its previous run, or None while neither has it yet.

    The kubelet restarts the failed container (a StatefulSet's pods restart Always), so between reading the status
    and reading the log the container may have been restarted: the new one's log may not exist yet (the kubelet
    then answers "unable to retrieve container logs for containerd://...") and the run that failed is the
    previous one. Anything other than the line, or nothing, fails the assertion with both logs shown."""
    logs = [node.logs(namespace, pod, "trainer"), node.logs(namespace, pod, "trainer", previous=True)]
    if NO_PYTHON + "\n" in logs:
        return NO_PYTHON + "\n"
    assert all(not log or log.startswith(KUBELET_NO_LOG) for log in logs), (pod, logs)
    return None


def test_an_image_with_neither_shell_nor_python_fails_at_start_naming_the_fix(node, where):
    delivery, namespace = where
    name = "e2e-bare"
    delete_gang(node, name, namespace)
    try:
        node.apply(namespace, statefulset_gang(name, node.images["bare"], ["python3", "-c", "print(1)"], 2))

        def exited():
            pods = pods_of(node, name, namespace)
            statuses = {p["metadata"]["name"]: next((s for s in p["status"].get("containerStatuses") or []
                                                     if s["name"] == "trainer"), {}) for p in pods}
            ended = {pod: (s.get("state", {}).get("terminated") or s.get("lastState", {}).get("terminated"))
                     for pod, s in statuses.items()}
            return len(pods) == 2 and all(ended.values()) and (pods, ended)
        with shown_on_failure(node, namespace, {}):
            pods, ended = wait_for(exited, 90, f"both trainers of {name} to exit")
        assert {delivery_of(p) for p in pods} == {delivery}
        for pod, terminated in ended.items():
            # The program ran (no "exec ...: no such file or directory" from the runtime) and exited as a shell
            # does for a missing command.
            assert terminated["exitCode"] == 127 and terminated.get("reason") == "Error", terminated
            log = wait_for(lambda: the_line_logged(node, namespace, pod), 30, f"{pod}'s trainer to log the fix")
        ours = {k: v for k, v in (statefulset(node, name, namespace)["metadata"].get("annotations") or {}).items()
                if k.startswith("trainhook.dev/")}
        print(f"{delivery}: {name} says: {log.strip()} (its StatefulSet's trainhook annotations: {json.dumps(ours)})")
    finally:
        delete_gang(node, name, namespace, wait=False)
