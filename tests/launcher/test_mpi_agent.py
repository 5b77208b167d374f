"""The rsh agent (`trainhook-launch kubexec`): how mpirun calls it, the transports, local-run detection, the agent
script, and the exec API's exit statuses. The exec API itself is exercised against the real control plane in
test_mpi_kubexec_cluster.py, and every transport end to end in test_mpi_local.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trainhook.launcher.mpi import kube_api
from trainhook.launcher.mpi import kubexec
from trainhook.launcher.mpi import local_transport
from trainhook.launcher.pod_view import ConfigError

# Captured from the real launchers with an agent that logs its argv (OpenMPI 4.1.4's orterun with
# `--mca plm_rsh_args "-o ConnectionAttempts=10"`, MPICH 4.0.2's Hydra with `-launcher rsh`).
OPENMPI_CALL = ["-o", "ConnectionAttempts=10", "pi-worker-1.pi", " orted", "-mca", "ess", '"env"', "-mca",
                "ess_base_jobid", '"691732480"', "-mca", "orte_hnp_uri",
                '"691732480.0;tcp://10.244.1.2:40063"', "--tree-spawn", "-mca", "pmix", '"^s1,s2,cray,isolated"']
HYDRA_CALL = ["pi-worker-1.pi", '"/usr/bin/hydra_pmi_proxy"', "--control-port", "pi-launcher-0.pi:36297",
              "--rmk", "user", "--launcher", "rsh", "--proxy-id", "0"]


def test_openmpis_call_is_split_into_ssh_options_host_and_the_remote_shells_words():
    call = kubexec.parse_call(OPENMPI_CALL)
    assert call.ssh_options == ["-o", "ConnectionAttempts=10"]
    assert (call.host, call.pod_label) == ("pi-worker-1.pi", "pi-worker-1")
    assert call.command == OPENMPI_CALL[3:]
    # Joined for /bin/sh -c, as ssh and rsh do: the shell strips OpenMPI's quotes.
    assert call.remote_command == " ".join(OPENMPI_CALL[3:])


def test_the_remote_command_means_to_a_shell_what_it_means_over_ssh(tmp_path):
    words = kubexec.parse_call(["host", "printf", "'%s|'", '"env"', "a b", "$((1+2))"]).remote_command
    done = subprocess.run([kubexec.REMOTE_SHELL, "-c", words], capture_output=True, text=True, check=True)
    assert done.stdout == "env|a|b|3|"


def test_hydras_call_has_no_options():
    call = kubexec.parse_call(HYDRA_CALL)
    assert (call.ssh_options, call.pod_label, call.command[0]) == ([], "pi-worker-1", '"/usr/bin/hydra_pmi_proxy"')


@pytest.mark.parametrize("argv,options,host,command", [
    (["w-0", "--", "echo", "hi"], [], "w-0", ["echo", "hi"]),
    (["--", "w-0", "echo", "hi"], [], "w-0", ["echo", "hi"]),
    (["-p22", "-x", "root@w-0.gang", "true"], ["-p22", "-x"], "root@w-0.gang", ["true"]),
    (["-xp", "2222", "-l", "mpi", "w-0", "true"], ["-xp", "2222", "-l", "mpi"], "w-0", ["true"]),
    (["-oBatchMode=yes", "-T", "w-0", "true", "--", "x"], ["-oBatchMode=yes", "-T"], "w-0", ["true", "--", "x"]),
])
def test_ssh_style_options_are_skipped_with_their_values(argv, options, host, command):
    call = kubexec.parse_call(argv)
    assert (call.ssh_options, call.host, call.command) == (options, host, command)
    assert call.pod_label == "w-0"


def test_our_own_options_come_first():
    call = kubexec.parse_call(["--transport", "local", "--run-dir=/r", "--namespace", "ns", "--container", "c",
                               "-o", "X=1", "h", "cmd"])
    assert (call.transport, call.run_dir, call.namespace, call.container) == ("local", "/r", "ns", "c")
    assert (call.ssh_options, call.host, call.command) == (["-o", "X=1"], "h", ["cmd"])


@pytest.mark.parametrize("argv,message", [
    ([], "kubexec: no host: trainhook-launch kubexec POD -- CMD [ARGS ...]"),
    (["-p"], "kubexec: ssh option -p needs a value"),
    (["w-0"], "kubexec w-0: no command (an interactive shell is not supported)"),
    (["--transport", "rsh", "w-0", "true"], "kubexec: --transport 'rsh': use one of gang, kubexec, ssh, local"),
])
def test_unusable_calls_say_why(argv, message):
    with pytest.raises(ConfigError) as error:
        kubexec.parse_call(argv)
    assert str(error.value) == message


def test_ssh_gets_the_callers_options_first_so_they_win():
    argv = kubexec.ssh_argv(kubexec.parse_call(["-o", "StrictHostKeyChecking=yes", "-p", "2222", "w-0", "a", "b"]))
    assert argv[:5] == ["ssh", "-o", "StrictHostKeyChecking=yes", "-p", "2222"]
    assert "ConnectionAttempts=10" in argv and "UserKnownHostsFile=/dev/null" in argv
    assert argv[-3:] == ["w-0", "a", "b"]


def test_the_transport_comes_from_the_flag_then_the_environment_then_the_gang_default(tmp_path):
    assert kubexec.choose_transport("ssh", {"TRAINHOOK_MPI_TRANSPORT": "kubexec"}) == ("ssh", None)
    assert kubexec.choose_transport("", {"TRAINHOOK_MPI_TRANSPORT": "ssh"}) == ("ssh", None)
    # Inside a local run too the default is the gang transport; `local` is chosen explicitly.
    assert kubexec.choose_transport("", {"TRAINHOOK_LOCAL_RUN_DIR": str(tmp_path)}) == ("gang", None)
    local = {"TRAINHOOK_LOCAL_RUN_DIR": str(tmp_path), "TRAINHOOK_MPI_TRANSPORT": "local"}
    assert kubexec.choose_transport("", local) == ("local", tmp_path)
    with pytest.raises(ConfigError, match="TRAINHOOK_MPI_TRANSPORT='scp': use one of gang, kubexec, ssh, local"):
        kubexec.choose_transport("", {"TRAINHOOK_MPI_TRANSPORT": "scp"})


def test_the_default_is_the_gang_transport_and_local_outside_a_local_run_is_refused():
    assert kubexec.choose_transport("", {}) == ("gang", None)
    with pytest.raises(ConfigError, match="not a pod of a `trainhook local` run"):
        kubexec.choose_transport("local", {})


# --- Local-run detection -----------------------------------------------------------------------------------------

MOUNTINFO = """\
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
30 27 0:40 / /tmp rw,nosuid - tmpfs tmpfs rw
88 27 254:0 /srv/run\\040one/pods/pi-0/hosts /etc/hosts rw,relatime - ext4 /dev/vda rw
89 27 0:40 /trainhook-local-x/pods/pi-1/hosts /etc/hosts rw - tmpfs tmpfs rw
"""


def test_the_hosts_bind_source_is_found_on_the_root_filesystem_and_on_a_tmpfs():
    assert local_transport.bind_sources("/etc/hosts", MOUNTINFO) == [Path("/tmp/trainhook-local-x/pods/pi-1/hosts")]
    only_root = "\n".join(MOUNTINFO.splitlines()[:3])
    assert local_transport.bind_sources("/etc/hosts", only_root) == [Path("/srv/run one/pods/pi-0/hosts")]
    assert local_transport.bind_sources("/etc/resolv.conf", MOUNTINFO) == []


def test_a_pod_finds_its_local_run_from_its_own_hosts_mount(tmp_path):
    """For real: a private mount namespace with a run's hosts file bind-mounted over /etc/hosts, as podinit does."""
    pod_dir = tmp_path / "run" / "pods" / "pi-0"
    pod_dir.mkdir(parents=True)
    (pod_dir / "hosts").write_text("127.0.0.1 localhost\n")
    (pod_dir / "sandbox.json").write_text("{}")
    probe = "from trainhook.launcher.mpi.local_transport import run_dir_from_hosts; print(run_dir_from_hosts())"
    script = f'mount --bind {pod_dir / "hosts"} /etc/hosts && exec {sys.executable} -c "{probe}"'
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "run")
    outside = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert outside.stdout.strip() == "None"


def test_a_local_pod_is_found_by_hostname_and_entered_through_the_runners_podexec(tmp_path):
    """The launcher reads the sandbox files for names only, and enters the pod with the runner's own `kubectl
    exec` (RUN_DIR/podexec, written by trainhook.local.podexec.install), never importing trainhook.local."""
    from trainhook.local.podexec import install
    from trainhook.local.pods import ContainerSpec, LocalPod
    for name, hostname in (("pi-launcher-0-abcde", "pi-launcher-0"), ("pi-worker-0-fghij", "pi-worker-0")):
        pod = LocalPod(name, "default", hostname, "10.244.0.2", "/run/netns/x", "/h", [],
                       [ContainerSpec("mpi", "main", ["true"], {"A": "1"}, training=True)])
        (tmp_path / "pods" / name).mkdir(parents=True)
        pod.save(tmp_path / "pods" / name)
    assert local_transport.local_pod_name(tmp_path, "pi-worker-0.pi") == "pi-worker-0-fghij"
    assert local_transport.local_pod_name(tmp_path, "pi-worker-0-fghij") == "pi-worker-0-fghij"
    assert local_transport.exec_argv(tmp_path, "pi-worker-0-fghij", ["/bin/sh", "-c", "orted"]) == [
        str(tmp_path / "podexec"), "pi-worker-0-fghij", "--", "/bin/sh", "-c", "orted"]
    with pytest.raises(local_transport.LocalPodError, match="no pod with hostname 'pi-worker-9'.*pi-launcher-0, pi-worker-0"):
        local_transport.local_pod_name(tmp_path, "pi-worker-9.pi")
    with pytest.raises(local_transport.LocalPodError, match="has no .*podexec .*written by `trainhook local`"):
        local_transport.exec_in(tmp_path, "pi-worker-0.pi", ["true"])
    script = install(tmp_path)
    assert script == tmp_path / "podexec" and os.access(script, os.X_OK)
    # The script runs the runner's podexec with this Python and the run directory, arguments intact.
    done = subprocess.run([str(script), "-c", "nope", "pi-worker-0-fghij", "--", "true"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1 and "pod pi-worker-0-fghij has no container 'nope'" in done.stderr


# --- The agent script ----------------------------------------------------------------------------------------

def test_the_agent_script_calls_kubexec_with_the_chosen_transport(tmp_path):
    path = tmp_path / "etc-mpi" / "kubexec.sh"
    kubexec.install_agent(path, "ssh", None)
    assert os.access(path, os.X_OK)
    text = path.read_text()
    assert text.startswith("#!/bin/sh\n") and "kubexec --transport ssh \"$@\"" in text
    # Run it: a bad call reaches our parser through the script, arguments intact.
    done = subprocess.run([str(path), "--transport", "rsh", "w-0", "true"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert "--transport 'rsh': use one of gang, kubexec, ssh, local" in done.stderr
    gang = tmp_path / "etc-mpi" / "gang.sh"
    kubexec.install_agent(gang, "gang", None)  # the gang transport's script names the launcher's doorway
    assert f"kubexec --transport gang --doorway {gang.parent}/.trainhook-doorway/doorway.sock \"$@\"" in gang.read_text()


def test_the_ssh_transport_execs_ssh_with_the_call(tmp_path):
    """The agent becomes ssh (exec), so ssh's own failure and exit code are what mpirun sees; the caller's
    ConnectionAttempts=1 wins over the agent's 10 (else this would retry for 10 s)."""
    if shutil.which("ssh") is None:
        pytest.fail("ssh is not installed (apt-get install openssh-client)")
    done = subprocess.run([sys.executable, "-m", "trainhook.launcher.cli", "kubexec", "--transport", "ssh",
                           "-o", "ConnectionAttempts=1", "-p", "1", "127.0.0.1", "true"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 255
    assert "port 1: Connection refused" in done.stderr


# --- The exec API's answers -------------------------------------------------------------------------------------

@pytest.mark.parametrize("status,expected", [
    ({"metadata": {}, "status": "Success"}, (0, "")),
    ({"metadata": {}, "status": "Failure", "message": "command terminated with non-zero exit code: error "
      "executing command [/bin/sh -c exit 3], exit code 3", "reason": "NonZeroExitCode",
      "details": {"causes": [{"reason": "ExitCode", "message": "3"}]}}, (3, "")),
    ({"metadata": {}, "status": "Failure", "message": 'exec: "/bin/sh": stat /bin/sh: no such file or directory',
      "reason": "InternalError"}, (255, 'exec: "/bin/sh": stat /bin/sh: no such file or directory')),
])
def test_the_exit_code_comes_from_the_error_channels_status(status, expected):
    assert kubexec.exit_status(json.dumps(status)) == expected


def test_a_cut_stream_is_a_failure_of_the_agent():
    assert kubexec.exit_status("") == (255, "the exec stream closed without an exit status")


def test_the_api_servers_message_is_taken_from_a_refused_upgrades_status():
    body = (b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"pod w-0 does '
            b'not have a host assigned","reason":"BadRequest","code":400}\n')
    assert kube_api.status_message(400, "Bad Request", body) == "pod w-0 does not have a host assigned (HTTP 400)"
    assert kube_api.status_message(502, "Bad Gateway", b"<html>") == "Bad Gateway (HTTP 502)"
