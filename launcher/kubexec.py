"""`trainhook-launch kubexec POD -- CMD`: the rsh agent through which mpirun starts its daemons in worker pods.

mpirun calls its agent the way it calls ssh: `AGENT [ssh options] HOST WORD...`, where the words are meant for
the remote shell (OpenMPI passes `orted -mca ess "env" ...` with the quotes still in; Hydra passes
`"/usr/bin/hydra_pmi_proxy" --control-port ...`), so the command that runs remotely is `/bin/sh -c "WORDS"`, the
words joined by spaces, exactly as ssh and rsh run it (and as Kubeflow v1's kubexec.sh did with `$*`).
Both spellings are accepted: `kubexec POD -- CMD ARGS` and `kubexec [-o Opt=v -p N -x ...] HOST CMD ARGS`;
`user@` is dropped from HOST except for ssh, and HOST's first DNS label is the pod (`w-1.job` -> pod `w-1`).

Transports (`--transport`, else TRAINHOOK_MPI_TRANSPORT, else `local` inside a `trainhook local` run, else
`kubexec`):
- `kubexec`: the Kubernetes exec API with the pod's ServiceAccount (in-cluster config, else the kubeconfig),
  through `kubernetes.stream.stream` on `connect_get_namespaced_pod_exec`; stdin, stdout and stderr are relayed
  and the exit code comes from the error channel. The pod is read first (for its container: the
  `trainhook.dev/container` annotation, else the first); a pod whose name is not its hostname (a Job's or bare
  pod) is found by listing the gang's pods. Needs `get`/`list` on pods and `create`/`get` on pods/exec (the
  chart's training ClusterRole).
- `ssh`: `ssh` with the given options first (they win), then StrictHostKeyChecking=no,
  UserKnownHostsFile=/dev/null, BatchMode=yes and ConnectionAttempts=10, as mpi-operator v2 runs it.
- `local`: the target pod of the local run (mpi_local).

The agent's own failures (no such pod, forbidden, pod not running) print one line naming the pod and the
reason and exit 255, ssh's code for "could not run the command at all".
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from trainhook import keys
from trainhook.launcher import mpi_local
from trainhook.launcher.gang import ConfigError

TH_MPI_TRANSPORT = "TRAINHOOK_MPI_TRANSPORT"
TRANSPORTS = ("kubexec", "ssh", "local")
EXIT_AGENT_FAILED = 255
REMOTE_SHELL = "/bin/sh"
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# ssh(1)'s options that take an argument (its getopt string), so `-p 22 HOST` is not read as host "22".
SSH_OPTIONS_WITH_ARGUMENT = set("BbcDEeFIiJLlmOoPpQRSWw")
SSH_DEFAULTS = ("-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
                "-o", "ConnectionAttempts=10", "-o", "LogLevel=ERROR")
OWN_OPTIONS = ("--transport", "--run-dir", "--namespace", "--container")



@dataclass
class AgentCall:
    host: str
    command: list[str]
    ssh_options: list[str] = field(default_factory=list)
    transport: str = ""
    run_dir: str = ""
    namespace: str = ""
    container: str = ""

    @property
    def pod_label(self) -> str:
        """The pod's hostname: HOST without `user@` and without its subdomain."""
        return self.host.rpartition("@")[2].split(".", 1)[0]

    @property
    def remote_command(self) -> str:
        return " ".join(self.command)


def parse_call(argv: Sequence[str]) -> AgentCall:
    """Read `[--transport T] [--run-dir D] [--namespace N] [--container C] [ssh options] HOST [--] CMD...`."""
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
                     own.get("container", ""))


def choose_transport(explicit: str, env: Mapping[str, str]) -> tuple[str, Path | None]:
    """(transport, local run directory): explicit choice, TRAINHOOK_MPI_TRANSPORT, a local run, kubexec."""
    transport = explicit or env.get(TH_MPI_TRANSPORT, "").strip()
    if transport and transport not in TRANSPORTS:
        raise ConfigError(f"{TH_MPI_TRANSPORT}={transport!r}: use one of {', '.join(TRANSPORTS)}")
    run_dir = mpi_local.local_run_dir(env) if transport in ("", "local") else None
    if transport == "local" and run_dir is None:
        raise ConfigError(f"{TH_MPI_TRANSPORT}=local, but this is not a pod of a `trainhook local` run "
                          f"(no {mpi_local.TH_LOCAL_RUN_DIR}, and /etc/hosts is not a local run's)")
    return transport or ("local" if run_dir else "kubexec"), run_dir


def fail(call: AgentCall, why: str) -> int:
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
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


def api_client():
    """A client with the pod's ServiceAccount (in a cluster), else the kubeconfig ($KUBECONFIG)."""
    from kubernetes import client, config
    try:
        config.load_incluster_config()
        return client.ApiClient()
    except config.ConfigException:
        pass
    try:
        return config.new_client_from_config()
    except (config.ConfigException, OSError) as e:
        raise ConfigError(f"no Kubernetes credentials: not in a pod with a ServiceAccount token, and no usable "
                          f"kubeconfig ({e})") from e


def api_error(error: Any) -> str:
    """The API server's own message from an ApiException, also from a refused WebSocket handshake (whose
    reason is `Handshake status 400 Bad Request -+-+- {headers} -+-+- {Status JSON}`)."""
    body = getattr(error, "body", None) or ""
    reason = str(getattr(error, "reason", "") or "")
    texts = [body.decode(errors="replace") if isinstance(body, bytes) else str(body)]
    texts += [part.strip() for part in reversed(reason.split(" -+-+- "))]
    for text in texts:
        try:
            status = json.loads(text)
        except ValueError:
            continue
        if isinstance(status, dict) and status.get("kind") == "Status":
            return f"{status.get('message') or status.get('reason')} (HTTP {status.get('code')})"
    return reason.split(" -+-+- ")[0] or repr(error)


def find_pod(core: Any, namespace: str, label: str, env: Mapping[str, str]) -> Any:
    """The pod named `label`, else the gang's pod whose hostname is `label` (Job and bare pods)."""
    from kubernetes.client.rest import ApiException
    try:
        return core.read_namespaced_pod(label, namespace)
    except ApiException as e:
        if e.status != 404:
            raise
    job = env.get(keys.TH_JOB_NAME, "").strip()
    selector = f"{keys.JOB_NAME}={job}" if job else None
    for pod in core.list_namespaced_pod(namespace, label_selector=selector).items:
        if (pod.spec.hostname or pod.metadata.name) == label:
            return pod
    raise LookupError(f"no pod {label!r} in namespace {namespace!r}"
                      + (f", and no pod of gang {job!r} with that hostname" if job else ""))


def container_of(pod: Any, wanted: str) -> str:
    if wanted:
        return wanted
    named = (pod.metadata.annotations or {}).get(keys.CONTAINER)
    return named or pod.spec.containers[0].name


def relay_stdin(response: Any) -> None:
    """Copy our stdin to the remote process; at EOF close its stdin (v5 protocol; v4 has no way to)."""
    try:
        while True:
            data = os.read(0, 65536)
            if not data:
                break
            response.write_stdin(data)
        response.close_channel(0)
    except (OSError, ValueError, AttributeError):
        pass  # no stdin, or the stream is already closed


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


def kubexec(call: AgentCall, env: Mapping[str, str]) -> int:
    from kubernetes import client
    from kubernetes.client.rest import ApiException
    from kubernetes.stream import stream
    from kubernetes.stream.ws_client import ERROR_CHANNEL

    namespace = namespace_of(call, env)
    where = f"pod {namespace}/{call.pod_label}"
    try:
        api = api_client()
    except ConfigError as e:
        return fail(call, str(e))
    with api:
        core = client.CoreV1Api(api)
        try:
            pod = find_pod(core, namespace, call.pod_label, env)
        except ApiException as e:
            hint = (" (bind the trainhook training ClusterRole to this pod's ServiceAccount: it needs get/list on "
                    "pods and create/get on pods/exec)" if e.status == 403 else "")
            return fail(call, f"cannot read {where}: {api_error(e)}{hint}")
        except LookupError as e:
            return fail(call, str(e))
        name, container = pod.metadata.name, container_of(pod, call.container)
        where = f"pod {namespace}/{name} (container {container})"
        try:
            response = stream(core.connect_get_namespaced_pod_exec, name, namespace,
                              command=[REMOTE_SHELL, "-c", call.remote_command], container=container,
                              stdin=True, stdout=True, stderr=True, tty=False, _preload_content=False,
                              binary=True)
        except ApiException as e:
            phase = getattr(pod.status, "phase", None) or "unknown"
            node = getattr(pod.spec, "node_name", None) or "no node"
            return fail(call, f"cannot exec in {where}, phase {phase}, {node}: {api_error(e)}")
        threading.Thread(target=relay_stdin, args=(response,), daemon=True).start()
        try:
            while response.is_open():
                response.update(timeout=1)
                for read, fd in ((response.read_stdout, 1), (response.read_stderr, 2)):
                    data = read(timeout=0) if response.peek_channel(fd) else b""
                    if data:
                        os.write(fd, data)
            for read, fd in ((response.read_stdout, 1), (response.read_stderr, 2)):
                if response.peek_channel(fd):
                    os.write(fd, read(timeout=0))
            raw = response.read_channel(ERROR_CHANNEL)
        finally:
            response.close()
    code, message = exit_status(raw.decode(errors="replace") if isinstance(raw, bytes) else raw)
    if message:
        return fail(call, f"in {where}: {message}")
    return code


# --- the agent script ----------------------------------------------------------------------------------------

def agent_script(transport: str, run_dir: Path | None) -> str:
    """The rsh agent mpirun is pointed at: a shell script (Hydra runs its launcher-exec without arguments)
    that calls this module with the transport the launcher chose."""
    words = [sys.executable, "-m", "trainhook.launcher.cli", "kubexec", "--transport", transport]
    if run_dir is not None:
        words += ["--run-dir", str(run_dir)]
    return ("#!/bin/sh\n"
            "# Written by trainhook-launch: the rsh agent mpirun starts its daemons with.\n"
            f"# AGENT [ssh options] HOST COMMAND... runs COMMAND in HOST's pod ({transport} transport).\n"
            f"exec {shlex.join(words)} \"$@\"\n")


def write_file(path: Path, text: str, mode: int) -> None:
    """Write atomically (mpirun may read the file while a second launcher attempt rewrites it); OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    temporary.chmod(mode)
    temporary.replace(path)


def install_agent(path: Path, transport: str, run_dir: Path | None) -> None:
    """Put the agent script at `path` (raises OSError). Workers need it too: OpenMPI's orted checks that its
    plm_rsh_agent exists before it starts, on every node (Kubeflow v1 mounts kubexec.sh in workers for this)."""
    write_file(path, agent_script(transport, run_dir), 0o755)


# --- entry ---------------------------------------------------------------------------------------------------

def run(argv: Sequence[str], env: Mapping[str, str]) -> int:
    call = parse_call(argv)
    transport, run_dir = choose_transport(call.transport, env)
    if call.run_dir:
        run_dir = Path(call.run_dir)
    if transport == "ssh":
        argv_ = ssh_argv(call)
        try:
            os.execvp(argv_[0], argv_)
        except OSError as e:
            return fail(call, f"cannot run ssh: {e.strerror or e}")
    if transport == "local":
        assert run_dir is not None
        try:
            mpi_local.exec_in(run_dir, call.pod_label, [REMOTE_SHELL, "-c", call.remote_command])
        except (mpi_local.LocalPodError, OSError) as e:
            return fail(call, str(e))
    return kubexec(call, env)


def main(argv: Sequence[str]) -> int:
    return run(argv, os.environ)
