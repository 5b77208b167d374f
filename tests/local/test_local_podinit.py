"""trainhook local: entering a pod (podinit) and its volumes, with real mount and UTS namespaces (root)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from trainhook.local.envvars import EnvError, Sources, base_env
from trainhook.local.network import Network
from trainhook.local.pods import ContainerSpec, LocalPod, build_pod, exec_in_pod
from trainhook.local.volumes import Mount, container_mounts, prepare_volumes


@pytest.fixture(scope="module")
def pod_net():
    net = Network()
    net.open()
    try:
        yield net.add_pod()
    finally:
        assert net.close() == []


def pod_with(pod_net, tmp_path, mounts=(), workdir=None, hostname="p-0"):
    hosts = tmp_path / "hosts"
    hosts.write_text(f"127.0.0.1 localhost\n{pod_net.ip} {hostname}.sub {hostname}\n")
    spec = ContainerSpec("c", "main", ["true"], base_env(hostname), list(mounts), workdir, training=True)
    return LocalPod("p-0", "default", hostname, pod_net.ip, pod_net.netns_path, str(hosts), [], [spec])


def run(pod, *command):
    proc = exec_in_pod(pod, list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = proc.communicate(timeout=30)
    return proc.returncode, out


def test_the_pod_sees_its_hosts_file_hostname_and_workdir(pod_net, tmp_path):
    pod = pod_with(pod_net, tmp_path, workdir=str(tmp_path / "work"))
    code, out = run(pod, "sh", "-c", "cat /etc/hosts; hostname; pwd; echo $HOSTNAME")
    assert code == 0, out
    assert out.splitlines() == ["127.0.0.1 localhost", f"{pod_net.ip} p-0.sub p-0", "p-0", str(tmp_path / "work"),
                                "p-0"]


def test_mounts_appear_at_new_paths_and_read_only_ones_refuse_writes(pod_net, tmp_path):
    source = tmp_path / "cfg"
    source.mkdir()
    (source / "train.py").write_text("print('from the configmap')\n")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    target = f"/tmp/trainhook-test-{uuid.uuid4().hex[:8]}"
    mounts = [Mount(str(source), f"{target}/code", read_only=True), Mount(str(scratch), f"{target}/out")]
    pod = pod_with(pod_net, tmp_path, mounts)
    code, out = run(pod, "sh", "-c", f"python {target}/code/train.py; echo x > {target}/out/f; "
                                     f"touch {target}/code/new 2>/dev/null || echo read-only")
    assert code == 0, out
    assert out.splitlines() == ["from the configmap", "read-only"]
    assert (scratch / "f").read_text() == "x\n"
    assert not (source / "new").exists()
    assert os.listdir(f"{target}/code") == []  # on the host the mount point stays an empty directory
    for path in (f"{target}/code", f"{target}/out", target):
        os.rmdir(path)


def test_a_missing_command_exits_127_and_a_bad_mount_126(pod_net, tmp_path):
    pod = pod_with(pod_net, tmp_path)
    code, out = run(pod, "no-such-command-here")
    assert code == 127 and "executable file not found" in out
    pod = pod_with(pod_net, tmp_path, [Mount(str(tmp_path / "missing"), "/tmp/x")])
    code, out = run(pod, "true")
    assert code == 126 and "does not exist" in out


def test_the_command_is_execd_so_its_pid_is_the_one_started(pod_net, tmp_path):
    pod = pod_with(pod_net, tmp_path)
    proc = exec_in_pod(pod, ["sh", "-c", "echo $$"], stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=30)
    assert int(out) == proc.pid


def test_podexec_enters_a_saved_pod(pod_net, tmp_path):
    pod = pod_with(pod_net, tmp_path, hostname="saved-0")
    pod_dir = tmp_path / "pods" / "saved-0"
    pod_dir.mkdir(parents=True)
    pod.name = "saved-0"
    pod.save(pod_dir)
    out = subprocess.run([sys.executable, "-m", "trainhook.local.podexec", str(tmp_path), "saved-0", "--",
                          "sh", "-c", "hostname; exit 7"], capture_output=True, text=True, timeout=30)
    assert (out.returncode, out.stdout.strip()) == (7, "saved-0")
    missing = subprocess.run([sys.executable, "-m", "trainhook.local.podexec", str(tmp_path), "nope", "--", "true"],
                             capture_output=True, text=True, timeout=30)
    assert missing.returncode == 1 and "no pod 'nope'" in missing.stderr


POD = {"apiVersion": "v1", "kind": "Pod",
       "metadata": {"name": "w-0", "namespace": "ml", "annotations": {"trainhook.dev/container": "main"}},
       "spec": {"hostname": "w-0", "subdomain": "w", "terminationGracePeriodSeconds": 5,
                "volumes": [{"name": "code", "configMap": {"name": "code", "items": [{"key": "a", "path": "d/a.py"}]}},
                            {"name": "scratch", "emptyDir": {}},
                            {"name": "data", "persistentVolumeClaim": {"claimName": "data-w-0"}}],
                "initContainers": [{"name": "prep", "command": ["true"]},
                                   {"name": "side", "command": ["sleep", "9"], "restartPolicy": "Always"}],
                "containers": [{"name": "helper", "command": ["sh"]},
                               {"name": "main", "command": ["python", "$(SCRIPT)"], "workingDir": "/w",
                                "env": [{"name": "SCRIPT", "value": "/code/d/a.py"},
                                        {"name": "TRAINHOOK_RANK", "value": "4"}],
                                "volumeMounts": [{"name": "scratch", "mountPath": "/w"},
                                                 {"name": "code", "mountPath": "/code"},
                                                 {"name": "data", "mountPath": "/w/data", "subPath": "x"}]}]}}
SOURCES = Sources({("ml", "code"): {"metadata": {"name": "code"}, "data": {"a": "print(1)", "b": "skip"}}}, {})


def test_build_pod_resolves_containers_like_the_kubelet(tmp_path):
    pod = build_pod(POD, "10.244.0.2", "/run/netns/x", tmp_path / "hosts", tmp_path / "pod", tmp_path / "claims",
                    SOURCES)
    assert [(c.name, c.kind) for c in pod.init_containers] == [("prep", "init"), ("side", "sidecar")]
    main = pod.training_container
    assert main.name == "main" and pod.rank == "4" and pod.grace_seconds == 5
    assert main.command == ["python", "/code/d/a.py"]
    assert main.env["HOSTNAME"] == "w-0" and main.workdir == "/w"
    assert [(Path(m.source).relative_to(tmp_path).as_posix(), m.target, m.read_only) for m in main.mounts] == [
        ("pod/volumes/scratch", "/w", False), ("pod/volumes/code", "/code", True),
        ("claims/ml/data-w-0/x", "/w/data", False)]
    assert (tmp_path / "pod/volumes/code/d/a.py").read_text() == "print(1)"
    assert not (tmp_path / "pod/volumes/code/b").exists()
    argv = pod.entry_argv(main)
    assert argv[:8] == ["nsenter", "--net=/run/netns/x", "unshare", "--mount", "--uts", "--propagation", "private",
                        "--"]
    assert argv[-3:] == ["--", "python", "/code/d/a.py"]
    assert "--workdir" in argv and f"{tmp_path}/pod/volumes/code:/code:ro" in argv


def test_a_missing_config_map_volume_is_refused(tmp_path):
    pod = {"metadata": {"name": "p", "namespace": "ml"},
           "spec": {"volumes": [{"name": "v", "configMap": {"name": "absent"}}]}}
    with pytest.raises(EnvError, match='configmap "absent" not found'):
        prepare_volumes(pod, tmp_path, tmp_path, SOURCES)


def test_a_mount_of_an_unknown_volume_is_refused():
    with pytest.raises(EnvError, match="names no volume"):
        container_mounts({"name": "c", "volumeMounts": [{"name": "x", "mountPath": "/x"}]}, {})


def test_volume_directories_have_the_modes_a_kubelet_gives_them(tmp_path):
    """Measured on the e2e node (`stat` in a pod): emptyDir and configMap 0777, secret 1777, whatever the umask.
    sshd's StrictModes refuses keys under the secret's world-writable directory in a pod; so must a local run."""
    pod = {"metadata": {"name": "p", "namespace": "ml"}, "spec": {"volumes": [
        {"name": "scratch", "emptyDir": {}},
        {"name": "code", "configMap": {"name": "code"}},
        {"name": "keys", "secret": {"secretName": "keys", "defaultMode": 0o600}}]}}
    sources = Sources(configmaps={("ml", "code"): {"data": {"a.py": "print(1)"}}},
                      secrets={("ml", "keys"): {"stringData": {"id": "key"}}})
    volumes = prepare_volumes(pod, tmp_path, tmp_path, sources)
    modes = {name: oct(volume.path.stat().st_mode & 0o7777) for name, volume in volumes.items()}
    assert modes == {"scratch": "0o777", "code": "0o777", "keys": "0o1777"}
    assert oct((volumes["keys"].path / "id").stat().st_mode & 0o777) == "0o600"
