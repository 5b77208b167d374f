"""Delivery through the launcher ConfigMap (webhook/launcher_configmap.py): in a namespace where the webhook keeps
it, a training pod mounts it at /trainhook and gets no init container; elsewhere the init container delivers as
before. The ConfigMap's items laid out as the kubelet lays them out run the same launcher the init container
writes, on a real Python."""

from __future__ import annotations

import hashlib
import base64
import copy
import subprocess
import sys
from pathlib import Path

import jsonpatch

from trainhook.gang import keys
from trainhook.launcher import deliver
from trainhook.webhook import launcher_configmap as lcm
from trainhook.webhook.admission.member import Denied
from trainhook.webhook.admission.mutate import mutate
from trainhook.webhook.admission.review import review
from trainhook.webhook.settings import Settings
from objects import container, pod_of_statefulset, statefulset


def digest(data: bytes) -> str:
    """Compared by digest: a failed comparison of two 300 KB zips would spend minutes in pytest's diff."""
    return hashlib.sha256(data).hexdigest()


ZIP, SHIM = lcm.content()
NAME = lcm.configmap_name(ZIP, SHIM)
SETTINGS = Settings(launcher_image="registry.example/launcher:1", launcher_configmap=NAME,
                    launcher_namespaces=frozenset({"team-a"}))


def pod(annotations: dict | None = None, namespace: str = "team-a", **fields) -> dict:
    c = container()
    c.update(fields)
    sts = mutate("StatefulSet", "CREATE", statefulset("ddp", 2, annotations=annotations, containers=[c]),
                 namespace, SETTINGS).obj
    return pod_of_statefulset(sts, 1)


def test_the_name_follows_the_content_and_the_configmap_holds_exactly_what_the_init_container_writes():
    assert NAME == lcm.configmap_name(*lcm.content()) and NAME.startswith("trainhook-launcher-")
    assert len(NAME) == len("trainhook-launcher-") + 12
    assert lcm.configmap_name(ZIP + b"x", SHIM) != NAME and lcm.configmap_name(ZIP, SHIM + b"#") != NAME
    cm = lcm.configmap(NAME, "team-a", ZIP, SHIM)
    assert digest(base64.b64decode(cm["binaryData"]["launcher.pyz"])) == digest(deliver.build_zip())
    # The entry point is the static program (binaryData), as the init container writes it (docs/use/delivery.md).
    assert deliver.is_program(SHIM) and "data" not in cm
    assert base64.b64decode(cm["binaryData"]["trainhook-launch"]) == deliver.entry_program()
    assert lcm.content_digest(cm["binaryData"], None) == NAME[len(lcm.PREFIX):]
    # a ConfigMap holds at most 1 MiB; the zip has bytecode beside its sources (deliver.py), stored where it fits
    # beside the entry program (tests/launcher/test_delivery_bytecode.py)
    assert len(ZIP) + len(SHIM) < lcm.MAX_BYTES


def test_a_pod_in_a_namespace_with_the_configmap_mounts_it_and_gets_no_init_container():
    out = mutate("Pod", "CREATE", pod(), "team-a", SETTINGS).obj
    assert "initContainers" not in out["spec"]
    assert out["spec"]["volumes"] == [{"name": keys.LAUNCHER_VOLUME, "configMap": {"name": NAME, "items": [
        {"key": "launcher.pyz", "path": "launcher.pyz", "mode": 0o444},
        {"key": "trainhook-launch", "path": "bin/trainhook-launch", "mode": 0o555}]}}]
    trainer = out["spec"]["containers"][0]
    assert trainer["command"] == [keys.LAUNCHER_COMMAND, "run", "--", "torchrun", "/workspace/train.py"]
    assert {"name": keys.LAUNCHER_VOLUME, "mountPath": "/trainhook", "readOnly": True} in trainer["volumeMounts"]
    # The gang's variables are the training container's (the launcher's barrier is the gang wait).
    env = {e["name"] for e in trainer["env"]}
    assert {keys.TH_RANK, keys.TH_REPLICAS, keys.TH_HOSTS, keys.TH_WAIT_TIMEOUT} <= env


def test_a_second_admission_changes_nothing_and_keeps_either_delivery():
    for namespace in ("team-a", "team-b"):
        once = mutate("Pod", "CREATE", pod(namespace=namespace), namespace, SETTINGS).obj
        again = mutate("Pod", "CREATE", copy.deepcopy(once), namespace, SETTINGS).obj
        assert again == once, namespace
    # A pod admitted with the init container keeps it when the namespace later gets the ConfigMap, and back.
    by_init = mutate("Pod", "CREATE", pod(namespace="team-b"), "team-b", SETTINGS).obj
    assert mutate("Pod", "CREATE", copy.deepcopy(by_init), "team-a", SETTINGS).obj["spec"] == by_init["spec"]
    by_cm = mutate("Pod", "CREATE", pod(), "team-a", SETTINGS).obj
    assert mutate("Pod", "CREATE", copy.deepcopy(by_cm), "team-b", SETTINGS).obj["spec"] == by_cm["spec"]


def test_elsewhere_the_init_container_delivers_and_waits_as_before():
    out = mutate("Pod", "CREATE", pod(namespace="team-b"), "team-b", SETTINGS).obj
    assert out["spec"]["volumes"] == [{"name": keys.LAUNCHER_VOLUME, "emptyDir": {}}]
    [init] = out["spec"]["initContainers"]
    assert init["command"] == ["trainhook-launch", "wait", "--install", "/trainhook"]
    # Nothing written yet (the server has not published): the init container everywhere.
    fresh = Settings(launcher_image="registry.example/launcher:1")
    assert "initContainers" in mutate("Pod", "CREATE", pod(), "team-a", fresh).obj["spec"]


def test_without_the_launcher_the_gang_wait_init_container_stays():
    out = mutate("Pod", "CREATE", pod({keys.LAUNCHER: keys.LAUNCHER_NONE}), "team-a", SETTINGS).obj
    [init] = out["spec"]["initContainers"]
    assert init["command"] == ["trainhook-launch", "wait"]
    assert "volumes" not in out["spec"]


def test_a_users_own_configmap_under_our_volume_name_is_still_refused():
    given = pod()
    given["spec"]["volumes"] = [{"name": keys.LAUNCHER_VOLUME, "configMap": {"name": "my-scripts"}}]
    try:
        mutate("Pod", "CREATE", given, "team-a", SETTINGS)
    except Denied as e:
        assert "the name of the volume trainhook delivers its launcher in" in str(e)
    else:
        raise AssertionError("a user's volume named trainhook-launcher was accepted")


def test_the_review_patch_applies_and_the_configmap_layout_runs_the_launcher(tmp_path):
    """The patch as the API server applies it; then the ConfigMap's items written as the kubelet writes them
    (each item at its path with its mode) and the shim run on a real Python: the same launcher as the init
    container's copy."""
    given = pod()
    request = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u1", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "namespace": "team-a",
        "operation": "CREATE", "object": given}}
    response = review(request, SETTINGS).answer["response"]
    patched = jsonpatch.apply_patch(given, base64.b64decode(response["patch"]).decode())
    volume = next(v for v in patched["spec"]["volumes"] if v["name"] == keys.LAUNCHER_VOLUME)
    cm = lcm.configmap(volume["configMap"]["name"], "team-a", ZIP, SHIM)
    files = {**{k: base64.b64decode(v) for k, v in cm["binaryData"].items()},
             **{k: v.encode() for k, v in cm.get("data", {}).items()}}
    for item in volume["configMap"]["items"]:
        path = tmp_path / item["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(files[item["key"]])
        path.chmod(item["mode"])
    shim = tmp_path / "bin" / "trainhook-launch"
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    done = subprocess.run([str(shim), "run", "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "usage: trainhook-launch run" in done.stdout
    assert oct(shim.stat().st_mode & 0o777) == "0o555"
    assert digest((tmp_path / "launcher.pyz").read_bytes()) == digest(deliver.build_zip())
