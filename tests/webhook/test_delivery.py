"""The launcher reaches every training container: the webhook wraps the command and adds the launcher volume; the
init container's `install` writes a launcher that runs on the image's own Python, isolated, and leaves the
training's environment alone."""

from __future__ import annotations

import hashlib
import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainhook.launcher import deliver
from trainhook.webhook.admission.member import Denied
from trainhook.webhook.admission.mutate import mutate
from trainhook.webhook.settings import Settings
from expected import LAUNCHER, LAUNCHER_MOUNT, LAUNCHER_VOLUME
from objects import container, pod_of_statefulset, statefulset
from test_server_https import admitted, valid


def digest(data: bytes) -> str:
    """Compared by digest: a failed comparison of two 300 KB zips would spend minutes in pytest's diff."""
    return hashlib.sha256(data).hexdigest()


SETTINGS = Settings(launcher_image="registry.example/launcher:1", wait_timeout=300)


def pod(annotations: dict | None = None, **fields) -> dict:
    """Pod 1 of a stamped 2-pod PyTorch StatefulSet whose training container has `fields`."""
    c = container()
    c.update(fields)
    c = {k: v for k, v in c.items() if v is not None}
    sts = mutate("StatefulSet", "CREATE", statefulset("ddp", 2, annotations=annotations, containers=[c]),
                 "team-a", SETTINGS).obj
    return pod_of_statefulset(sts, 1)


def trainer(obj: dict) -> dict:
    return obj["spec"]["containers"][0]


# --- The webhook's wrapping ------------------------------------------------------------------------------------

def test_the_command_runs_under_the_delivered_launcher_and_args_are_untouched():
    given = pod(args=["--epochs", "3"])
    out = mutate("Pod", "CREATE", given, "team-a", SETTINGS).obj
    assert trainer(out)["command"] == [LAUNCHER, "run", "--", "torchrun", "/workspace/train.py"]
    assert trainer(out)["args"] == ["--epochs", "3"]
    assert trainer(out)["volumeMounts"] == [LAUNCHER_MOUNT]
    assert out["spec"]["volumes"] == [LAUNCHER_VOLUME]
    init = out["spec"]["initContainers"][0]
    assert init["command"] == ["trainhook-launch", "wait", "--install", "/trainhook"]
    assert init["volumeMounts"] == [{"name": "trainhook-launcher", "mountPath": "/trainhook"}]


@pytest.mark.parametrize("written", [["trainhook-launch", "run", "--", "python", "t.py"],
                                     ["/usr/local/bin/trainhook-launch", "run", "--", "python", "t.py"],
                                     [LAUNCHER, "run", "--", "python", "t.py"]])
def test_a_command_that_already_runs_the_launcher_is_pointed_at_the_delivered_one_not_wrapped_twice(written):
    out = mutate("Pod", "CREATE", pod(command=written), "team-a", SETTINGS).obj
    assert trainer(out)["command"] == [LAUNCHER, "run", "--", "python", "t.py"]
    again = mutate("Pod", "CREATE", out, "team-a", SETTINGS).obj
    assert again == out


def test_the_opt_out_leaves_the_command_and_the_volumes_alone():
    given = pod({"trainhook.dev/launcher": "none"})
    out = mutate("Pod", "CREATE", given, "team-a", SETTINGS).obj
    assert trainer(out)["command"] == ["torchrun", "/workspace/train.py"]
    assert "volumes" not in out["spec"] and "volumeMounts" not in trainer(out)
    assert "--install" not in out["spec"]["initContainers"][0]["command"]


def test_a_container_without_command_is_refused_naming_the_key_and_the_fixes():
    with pytest.raises(Denied) as denied:
        mutate("Pod", "CREATE", pod(command=None), "team-a", SETTINGS)
    [problem] = denied.value.problems
    assert problem.startswith("spec.containers[trainer].command=None: the training command cannot be wrapped")
    assert "set `command`" in problem and "trainhook.dev/entrypoint" in problem
    assert "trainhook.dev/launcher: none" in problem


def test_a_workload_whose_pods_would_be_refused_is_refused_at_apply():
    c = {k: v for k, v in container().items() if k != "command"}
    with pytest.raises(Denied) as denied:
        mutate("StatefulSet", "CREATE", statefulset("ddp", 2, containers=[c]), "team-a", SETTINGS)
    assert denied.value.problems[0].startswith("spec.containers[trainer].command=None: the training command cannot "
                                               "be wrapped")
    annotated = statefulset("ddp", 2, annotations={"trainhook.dev/entrypoint": '["python", "t.py"]'}, containers=[c])
    assert mutate("StatefulSet", "CREATE", annotated, "team-a", SETTINGS).obj


def test_an_mpi_launchers_workers_need_no_command():
    workers = statefulset("pi-worker", 2, labels={"trainhook.dev/framework": "mpi", "trainhook.dev/job-name": "pi",
                                                  "trainhook.dev/role": "worker"},
                          annotations={"trainhook.dev/replicas": "launcher=1,worker=2"}, service="pi",
                          containers=[{"name": "mpi", "image": "mpi:1"}])
    sts = mutate("StatefulSet", "CREATE", workers, "team-a", SETTINGS).obj
    out = mutate("Pod", "CREATE", pod_of_statefulset(sts, 1), "team-a", SETTINGS).obj
    assert trainer(out)["command"] == [LAUNCHER, "mpi-worker"]


def test_the_entrypoint_annotation_stands_in_for_a_missing_command():
    given = pod({"trainhook.dev/entrypoint": '["python", "/app/train.py"]'}, command=None, args=["--lr", "0.1"])
    out = mutate("Pod", "CREATE", given, "team-a", SETTINGS).obj
    assert trainer(out)["command"] == [LAUNCHER, "run", "--", "python", "/app/train.py"]
    assert trainer(out)["args"] == ["--lr", "0.1"]
    assert mutate("Pod", "CREATE", out, "team-a", SETTINGS).obj == out


@pytest.mark.parametrize("value", ["[1, 2]", "[]", "[\"python\"", "", 7, ["python"]])
def test_a_malformed_entrypoint_is_refused(value):
    with pytest.raises(Denied) as denied:
        mutate("Pod", "CREATE", pod({"trainhook.dev/entrypoint": value}, command=None), "team-a", SETTINGS)
    assert denied.value.problems[0].startswith(f"trainhook.dev/entrypoint={value!r}: not an entrypoint")


def test_an_unknown_launcher_mode_is_refused():
    with pytest.raises(Denied) as denied:
        mutate("Pod", "CREATE", pod({"trainhook.dev/launcher": "baked"}), "team-a", SETTINGS)
    assert denied.value.problems == [
        "trainhook.dev/launcher='baked': unknown launcher mode; use one of delivered, none"]


def test_user_init_containers_that_call_the_launcher_get_the_delivered_copy_after_the_install():
    given = pod()
    given["spec"]["initContainers"] = [{"name": "tf", "image": "u:1", "command": ["trainhook-launch", "tf-config"]},
                                       {"name": "other", "image": "u:1", "command": ["sh", "-c", "true"]}]
    before = copy.deepcopy(given)
    out = mutate("Pod", "CREATE", given, "team-a", SETTINGS).obj
    names = [c["name"] for c in out["spec"]["initContainers"]]
    assert names == ["trainhook-gang-wait", "tf", "other"]
    assert out["spec"]["initContainers"][1]["command"] == [LAUNCHER, "tf-config"]
    assert out["spec"]["initContainers"][1]["volumeMounts"] == [LAUNCHER_MOUNT]
    assert out["spec"]["initContainers"][2] == before["spec"]["initContainers"][1]
    assert given == before


def test_a_users_volume_under_the_launchers_name_is_refused():
    given = pod()
    given["spec"]["volumes"] = [{"name": "trainhook-launcher", "configMap": {"name": "x"}}]
    with pytest.raises(Denied) as denied:
        mutate("Pod", "CREATE", given, "team-a", SETTINGS)
    assert denied.value.problems[0].startswith("spec.volumes='trainhook-launcher': the name of the volume")


def test_a_users_own_mount_at_the_launchers_path_is_refused():
    given = pod()
    trainer(given)["volumeMounts"] = [{"name": "mine", "mountPath": "/trainhook/"}]
    given["spec"]["volumes"] = [{"name": "mine", "emptyDir": {}}]
    with pytest.raises(Denied) as denied:
        mutate("Pod", "CREATE", given, "team-a", SETTINGS)
    assert denied.value.problems[0].startswith("spec.containers[trainer].volumeMounts='/trainhook': the path "
                                               "trainhook delivers its launcher to")


def test_the_injected_container_passes_pod_security_restricted_and_the_pod_is_valid(webhook):
    out, response = admitted(webhook, dict(pod(), metadata={**pod()["metadata"], "namespace": "team-a"}))
    assert response["allowed"] is True
    valid(out)
    context = out["spec"]["initContainers"][0]["securityContext"]
    assert context["runAsNonRoot"] is True and context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]} and context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert context["readOnlyRootFilesystem"] is True
    assert trainer(out)["command"][0] == LAUNCHER


# --- The delivered launcher ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("launcher")
    done = subprocess.run([sys.executable, "-m", "trainhook.launcher.cli", "install", str(directory)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return directory


def image_env(python_dir: str, **more: str) -> dict:
    """An environment like a training image's: its Python on PATH, nothing of trainhook's."""
    return {"PATH": f"{python_dir}:/usr/bin:/bin", "HOME": "/root", **more}


def test_install_writes_the_zip_and_the_entry_program_and_gives_the_same_bytes_each_time(installed, tmp_path):
    entry = installed / "bin" / "trainhook-launch"
    assert os.access(entry, os.X_OK) and (installed / "launcher.pyz").is_file()
    assert deliver.is_program(entry.read_bytes())  # not a #!/bin/sh script: shell-less images run it too
    deliver.install(tmp_path)
    assert digest((tmp_path / "launcher.pyz").read_bytes()) == digest((installed / "launcher.pyz").read_bytes())
    assert digest((tmp_path / "bin" / "trainhook-launch").read_bytes()) == digest(entry.read_bytes())
    assert not list(tmp_path.glob(".*.partial")) and not list((tmp_path / "bin").glob(".*"))


def test_the_training_runs_with_the_images_environment_untouched(installed, tmp_path):
    """The launcher runs isolated; the training gets the container's environment as it was, with nothing of ours
    that changes how Python finds modules or libraries."""
    decoy = tmp_path / "decoy" / "trainhook"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text("raise SystemExit('the launcher imported a trainhook from PYTHONPATH')\n")
    given = image_env(str(Path(sys.executable).parent), PYTHONPATH=str(decoy.parent), MY_VAR="1")
    script = "import json, os; print(json.dumps(dict(os.environ)))"
    done = subprocess.run([str(installed / "bin" / "trainhook-launch"), "run", "--", "python3", "-c", script],
                          env=given, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["PYTHONPATH"] == str(decoy.parent) and seen["MY_VAR"] == "1"
    loading = {"PYTHONPATH", "PYTHONHOME", "LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONSTARTUP", "PYTHONNOUSERSITE",
               "PYTHONSAFEPATH", "PYTHONUSERBASE", "PYTHONEXECUTABLE", "PYTHONPLATLIBDIR"}
    added = {name for name in seen if name not in given and name not in ("PWD", "SHLVL", "_")}
    assert not added & loading and not any(name.startswith("PYTHON") for name in added), added


def test_the_exit_code_is_the_trainings(installed, tmp_path):
    done = subprocess.run([str(installed / "bin" / "trainhook-launch"), "run", "--", "sh", "-c", "exit 3"],
                          env=image_env(str(Path(sys.executable).parent)), capture_output=True, timeout=60)
    assert done.returncode == 3


def test_an_image_without_python_fails_at_start_with_one_line_naming_the_fix(installed, tmp_path):
    done = subprocess.run([str(installed / "bin" / "trainhook-launch"), "run", "--", "true"],
                          env={"PATH": str(tmp_path)}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 127
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith("trainhook-launch: no python3 or python on PATH in this image; use an image with "
                                  "python3 3.8 or newer")


def test_a_python_older_than_3_8_is_told_the_fix_before_anything_is_imported(installed, tmp_path):
    """The zip's __main__ runs first; here it runs under this Python told that it is 3.7."""
    import zipfile
    main = zipfile.ZipFile(installed / "launcher.pyz").read("__main__.py").decode()
    check = f"import sys; sys.version_info = (3, 7, 9); exec(compile({main!r}, '__main__', 'exec'))"
    done = subprocess.run([sys.executable, "-I", "-c", check], capture_output=True, text=True, timeout=60)
    assert done.returncode == 127
    assert done.stderr == ("trainhook-launch: this image's Python is 3.7; " + deliver.FIX + "\n")
