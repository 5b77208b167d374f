"""`trainhook-launch kubexec POD -- CMD`: the rsh agent through which mpirun starts its daemons in worker pods.

mpirun calls its agent the way it calls ssh: `AGENT [ssh options] HOST WORD...`, where the words are meant for
the remote shell (OpenMPI passes `orted -mca ess "env" ...` with the quotes still in; Hydra passes
`"/usr/bin/hydra_pmi_proxy" --control-port ...`), so the command that runs remotely is `/bin/sh -c "WORDS"`, the
words joined by spaces, exactly as ssh and rsh run it (and as Kubeflow v1's kubexec.sh did with `$*`).
Both spellings are accepted: `kubexec POD -- CMD ARGS` and `kubexec [-o Opt=v -p N -x ...] HOST CMD ARGS`;
`user@` is dropped from HOST except for ssh, and HOST's first DNS label is the pod (`w-1.job` -> pod `w-1`).

Transports (`--transport`, else TRAINHOOK_MPI_TRANSPORT, else `gang`):
- `gang` (the default, in a cluster and under `trainhook local` alike): HOST's own `mpi-worker` runs the command,
  asked over the gang's authenticated control port through the launcher's doorway (gang_transport, mpi_spawn): no
  Kubernetes API call, no exec permission, no sshd. `--doorway PATH` is the launcher's unix socket (the agent
  script names it).
- `kubexec` (an explicit opt-in: it needs an exec grant, which the chart no longer gives): the Kubernetes exec
  API with the pod's ServiceAccount (else a JSON kubeconfig: kube_api), over a websocket with the
  `v4.channel.k8s.io` protocol (`v5` where the server offers it): every message's first byte is its channel
  (0 stdin, 1 stdout, 2 stderr, 3 the exit Status); stdin, stdout and stderr are relayed and the exit code comes
  from the Status. The pod is read first (for its container: the `trainhook.dev/container`
  annotation, else the first); a pod whose name is not its hostname (a Job's or bare pod) is found by listing
  the gang's pods. Needs `get`/`list` on pods and `create`/`get` on pods/exec for the gang's pods (a Role the user
binds; docs/use/frameworks/mpi.md).
- `ssh`: `ssh` with the given options first (they win), then StrictHostKeyChecking=no,
  UserKnownHostsFile=/dev/null, BatchMode=yes and ConnectionAttempts=10, as mpi-operator v2 runs it.
- `local`: the target pod of the local run, through the runner's RUN_DIR/podexec (local_transport); explicit only.

The agent's own failures (no such pod, forbidden, pod not running) print one line naming the pod and the
reason and exit 255, ssh's code for "could not run the command at all".
"""

from __future__ import annotations

import json
import os
import select
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence
from urllib.parse import quote, urlencode

from trainhook.gang import keys
from trainhook.gang.keys import TH_MPI_TRANSPORT  # defined in keys.py; read from here by mpi_launch too
from trainhook.launcher import deliver
from trainhook.launcher.mpi import kube_api
from trainhook.launcher.mpi import kube_websocket
from trainhook.launcher.mpi import gang_transport
from trainhook.launcher.mpi import local_transport
from trainhook.launcher.pod_view import ConfigError
from trainhook.launcher.policy import SERVICE_ACCOUNT_DIR
from trainhook.gang.keys import TH_SERVICE_ACCOUNT_DIR
from trainhook.gang.wiring import AGENT_PATH
from trainhook.launcher.files import write_atomically

TRANSPORTS = ("gang", "kubexec", "ssh", "local")  # mpi_control.TRANSPORTS
DEFAULT_TRANSPORT = "gang"
EXIT_AGENT_FAILED = 255
REMOTE_SHELL = "/bin/sh"
PROTOCOL_V4, PROTOCOL_V5 = "v4.channel.k8s.io", "v5.channel.k8s.io"
STDIN, STDOUT, STDERR, ERROR, CLOSE_CHANNEL = 0, 1, 2, 3, 255  # the exec channels (v5 adds closing one)
# ssh(1)'s options that take an argument (its getopt string), so `-p 22 HOST` is not read as host "22".
SSH_OPTIONS_WITH_ARGUMENT = set("BbcDEeFIiJLlmOoPpQRSWw")
SSH_DEFAULTS = ("-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
                "-o", "ConnectionAttempts=10", "-o", "LogLevel=ERROR")
OWN_OPTIONS = ("--transport", "--run-dir", "--namespace", "--container", "--doorway")


@dataclass
class AgentCall:
    host: str
    command: list[str]
    ssh_options: list[str] = field(default_factory=list)
    transport: str = ""
    run_dir: str = ""
    namespace: str = ""
    container: str = ""
    doorway: str = ""

    @property
    def pod_label(self) -> str:
        """The pod's hostname: HOST without `user@` and without its subdomain."""
        return self.host.rpartition("@")[2].split(".", 1)[0]

    @property
    def remote_command(self) -> str:
        return " ".join(self.command)


def parse_call(argv: Sequence[str]) -> AgentCall:
    """Read `[--transport T] [--run-dir D] [--namespace N] [--container C] [--doorway S] [ssh options] HOST [--]
    CMD...`."""
    args = list(argv)
    own: dict[str, str] = {}
    ssh_options: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, value = arg.partition("=")
        if name in OWN_OPTIONS:
            if not eq:
                if i + 1 >= len(args):
                    raise ConfigError(f"kubexec: {name} needs a value")
                value = args[i + 1]
                i += 1
            own[name[2:].replace("-", "_")] = value
            i += 1
            continue
        if arg == "--" or not arg.startswith("-") or arg == "-":
            break
        ssh_options.append(arg)
        # -p22 carries its value; -p 22 (or -xp 22) takes the next word.
        letters = arg[1:]
        for position, letter in enumerate(letters):
            if letter in SSH_OPTIONS_WITH_ARGUMENT:
                if position == len(letters) - 1:
                    if i + 1 >= len(args):
                        raise ConfigError(f"kubexec: ssh option -{letter} needs a value")
                    ssh_options.append(args[i + 1])
                    i += 1
                break
        i += 1
    if i < len(args) and args[i] == "--":
        i += 1
    if i >= len(args):
        raise ConfigError("kubexec: no host: trainhook-launch kubexec POD -- CMD [ARGS ...]")
    host = args[i]
    command = args[i + 1:]
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise ConfigError(f"kubexec {host}: no command (an interactive shell is not supported)")
    transport = own.get("transport", "")
    if transport and transport not in TRANSPORTS:
        raise ConfigError(f"kubexec: --transport {transport!r}: use one of {', '.join(TRANSPORTS)}")
    return AgentCall(host, command, ssh_options, transport, own.get("run_dir", ""), own.get("namespace", ""),
                     own.get("container", ""), own.get("doorway", ""))


def choose_transport(explicit: str, env: Mapping[str, str]) -> tuple[str, Path | None]:
    """(transport, local run directory): explicit choice, else TRAINHOOK_MPI_TRANSPORT, else `gang`. The run
    directory is found for the `local` transport only (an explicit choice)."""
    transport = explicit or env.get(TH_MPI_TRANSPORT, "").strip() or DEFAULT_TRANSPORT
    if transport not in TRANSPORTS:
        raise ConfigError(f"{TH_MPI_TRANSPORT}={transport!r}: use one of {', '.join(TRANSPORTS)}")
    run_dir = local_transport.local_run_dir(env) if transport == "local" else None
    if transport == "local" and run_dir is None:
        raise ConfigError(f"{TH_MPI_TRANSPORT}=local, but this is not a pod of a `trainhook local` run "
                          f"(no {local_transport.TH_LOCAL_RUN_DIR}, and /etc/hosts is not a local run's)")
    return transport, run_dir


def agent_failed(call: AgentCall, why: str) -> int:
    print(f"trainhook-launch kubexec {call.host}: {why}", file=sys.stderr, flush=True)
    return EXIT_AGENT_FAILED


# --- ssh ---------------------------------------------------------------------------------------------------

def ssh_argv(call: AgentCall) -> list[str]:
    """ssh's own command line: the caller's options first (ssh keeps the first value of each option)."""
    return ["ssh", *call.ssh_options, *SSH_DEFAULTS, call.host, *call.command]


# --- kubexec -----------------------------------------------------------------------------------------------

def namespace_of(call: AgentCall, env: Mapping[str, str]) -> str:
    if call.namespace:
        return call.namespace
    if env.get(keys.TH_NAMESPACE, "").strip():
        return env[keys.TH_NAMESPACE].strip()
    try:
        return (Path(service_account_dir(env)) / "namespace").read_text().strip() or "default"
    except OSError:
        return "default"


def service_account_dir(env: Mapping[str, str]) -> str:
    return env.get(TH_SERVICE_ACCOUNT_DIR, "").strip() or SERVICE_ACCOUNT_DIR


def find_pod(api: kube_api.Client, namespace: str, label: str, env: Mapping[str, str]) -> dict:
    """The pod named `label`, else the gang's pod whose hostname is `label` (Job and bare pods)."""
    job = env.get(keys.TH_JOB_NAME, "").strip()
    try:
        return api.get(f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(label)}")
    except kube_api.ApiError as e:
        # 403 too when the gang's Role names its pods (resourceNames): a Job pod's name is not its hostname.
        if e.status != 404 and not (e.status == 403 and job):
            raise
    query = f"?{urlencode({'labelSelector': f'{keys.JOB_NAME}={job}'})}" if job else ""
    for pod in api.get(f"/api/v1/namespaces/{quote(namespace)}/pods{query}").get("items") or []:
        if ((pod.get("spec") or {}).get("hostname") or pod["metadata"]["name"]) == label:
            return pod
    raise LookupError(f"no pod {label!r} in namespace {namespace!r}"
                      + (f", and no pod of gang {job!r} with that hostname" if job else ""))


def container_of(pod: dict, wanted: str) -> str:
    if wanted:
        return wanted
    named = (pod["metadata"].get("annotations") or {}).get(keys.CONTAINER)
    return named or pod["spec"]["containers"][0]["name"]


def exec_path(namespace: str, pod: str, container: str, command: Sequence[str]) -> str:
    """The exec API's URL path: every word of the command is its own `command` parameter."""
    query = [("command", word) for word in command]
    query += [("container", container), ("stdin", "true"), ("stdout", "true"), ("stderr", "true")]
    return f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(pod)}/exec?{urlencode(query)}"


def exit_status(error_channel: str) -> tuple[int, str]:
    """(exit code, message) from the exec error channel: a metav1.Status, empty when the stream was cut."""
    if not error_channel:
        return EXIT_AGENT_FAILED, "the exec stream closed without an exit status"
    try:
        status = json.loads(error_channel)
    except ValueError:
        return EXIT_AGENT_FAILED, f"unreadable exit status {error_channel[:200]!r}"
    if status.get("status") == "Success":
        return 0, ""
    for cause in (status.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode" and str(cause.get("message", "")).isdigit():
            return int(cause["message"]), ""
    return EXIT_AGENT_FAILED, status.get("message") or status.get("reason") or "the command failed"


def relay(ws: kube_websocket.WebSocket, stdin: int = 0) -> bytes:
    """Relay our stdin to the remote command and its stdout and stderr to ours until the server closes the
    stream; returns what arrived on the error channel (the exit Status). One thread, select(): the TLS socket is
    never read and written at once from two threads. At our stdin's end the remote stdin is closed where the
    protocol can (v5); v4 has no way to."""
    error = b""
    try:
        os.fstat(stdin)
        reading = True
    except OSError:
        reading = False  # no stdin at all
    while not ws.closed:
        if ws.pending():
            ready: list[Any] = [ws]
        else:
            waiting: list[Any] = [ws, stdin] if reading else [ws]  # select() takes both: fileno() and an fd
            ready, _, _ = select.select(waiting, [], [])
        if stdin in ready:
            data = os.read(stdin, 65536)
            if data:
                ws.send(bytes([STDIN]) + data)
            else:
                reading = False
                if ws.protocol == PROTOCOL_V5:
                    ws.send(bytes([CLOSE_CHANNEL, STDIN]))
        if ws in ready:
            for message in ws.receive():
                if message[:1] in (bytes([STDOUT]), bytes([STDERR])):
                    gang_transport.write_all(message[0], message[1:])
                elif message[:1] == bytes([ERROR]):
                    error += message[1:]
    return error


def kubexec(call: AgentCall, env: Mapping[str, str]) -> int:
    namespace = namespace_of(call, env)
    where = f"pod {namespace}/{call.pod_label}"
    try:
        api = kube_api.any_client(service_account_dir(env), env)
    except kube_api.NoCredentials as e:
        return agent_failed(call, str(e))
    try:
        pod = find_pod(api, namespace, call.pod_label, env)
    except kube_api.ApiError as e:
        hint = (" (the kubexec transport needs get/list on pods and create/get on pods/exec, which the chart "
                "no longer grants: bind a Role for this gang's pods to this pod's ServiceAccount, or use the "
                "default gang transport)" if e.status == 403 else "")
        return agent_failed(call, f"cannot read {where}: {e}{hint}")
    except kube_api.KubeError as e:
        return agent_failed(call, f"cannot read {where}: {e}")
    except LookupError as e:
        return agent_failed(call, str(e))
    name, container = pod["metadata"]["name"], container_of(pod, call.container)
    where = f"pod {namespace}/{name} (container {container})"
    try:
        ws = api.websocket(exec_path(namespace, name, container, [REMOTE_SHELL, "-c", call.remote_command]),
                           (PROTOCOL_V5, PROTOCOL_V4))
    except kube_api.KubeError as e:
        phase = (pod.get("status") or {}).get("phase") or "unknown"
        node = pod["spec"].get("nodeName") or "no node"
        return agent_failed(call, f"cannot exec in {where}, phase {phase}, {node}: {e}")
    try:
        raw = relay(ws)
    except OSError as e:
        return agent_failed(call, f"in {where}: the exec stream broke ({e})")
    finally:
        ws.close()
    code, message = exit_status(raw.decode(errors="replace"))
    if message:
        return agent_failed(call, f"in {where}: {message}")
    return code


# --- the agent script ----------------------------------------------------------------------------------------

def agent_script(transport: str, run_dir: Path | None, doorway: Path | None = None) -> str:
    """The rsh agent mpirun is pointed at: a shell script (Hydra runs its launcher-exec without arguments)
    that calls this module with the transport the launcher chose (and, for `gang`, the launcher's doorway)."""
    words = [*deliver.self_command(), "kubexec", "--transport", transport]
    if run_dir is not None:
        words += ["--run-dir", str(run_dir)]
    if doorway is not None:
        words += ["--doorway", str(doorway)]
    return ("#!/bin/sh\n"
            "# Written by trainhook-launch: the rsh agent mpirun starts its daemons with.\n"
            f"# AGENT [ssh options] HOST COMMAND... runs COMMAND in HOST's pod ({transport} transport).\n"
            f"exec {shlex.join(words)} \"$@\"\n")


def install_agent(path: Path, transport: str, run_dir: Path | None) -> None:
    """Put the agent script at `path` (raises OSError). Workers need it too: OpenMPI's orted checks that its
    plm_rsh_agent exists before it starts, on every node (Kubeflow v1 mounts kubexec.sh in workers for this)."""
    doorway = gang_transport.doorway_path(path) if transport == "gang" else None
    write_atomically(path, agent_script(transport, run_dir, doorway).encode(), 0o755)


# --- entry ---------------------------------------------------------------------------------------------------

def run_agent_call(argv: Sequence[str], env: Mapping[str, str]) -> int:
    call = parse_call(argv)
    transport, run_dir = choose_transport(call.transport, env)
    if call.run_dir:
        run_dir = Path(call.run_dir)
    if transport == "ssh":
        argv_ = ssh_argv(call)
        try:
            os.execvp(argv_[0], argv_)
        except OSError as e:
            return agent_failed(call, f"cannot run ssh: {e.strerror or e}")
    if transport == "gang":
        doorway = Path(call.doorway) if call.doorway else gang_transport.doorway_path(Path(AGENT_PATH))
        return gang_transport.run_agent(call.host, call.remote_command, doorway)
    if transport == "local":
        assert run_dir is not None
        try:
            local_transport.exec_in(run_dir, call.pod_label, [REMOTE_SHELL, "-c", call.remote_command])
        except (local_transport.LocalPodError, OSError) as e:
            return agent_failed(call, str(e))
    return kubexec(call, env)


def main(argv: Sequence[str]) -> int:
    return run_agent_call(argv, os.environ)
