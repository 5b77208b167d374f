"""`trainhook-launch mpirun [--] CMD ARGS`: an MPI gang's launcher.

1. If this pod is not the gang's launcher (a worker of a gang whose worker 0 launches: one StatefulSet whose
   pods all run the same command), it serves as a worker (`mpi-worker`) and CMD is not run here.
2. It connects to every worker's control port (mpi_control), with TRAINHOOK_WAIT_TIMEOUT as the deadline; on
   the deadline it exits 1 naming each worker still missing and why.
3. It writes the hostfile (one line per worker, in index order, with the slots each worker reported; worker 0
   itself first when it is the launcher) and the rsh agent script, at the paths the webhook's variables name
   (/etc/mpi/hostfile, /etc/mpi/kubexec.sh). The agent calls `trainhook-launch kubexec` with the transport
   chosen here: TRAINHOOK_MPI_TRANSPORT, else `gang`. For `gang` it serves the agents' doorway (gang_transport) while
   mpirun runs: the agents get authenticated connections to the workers' mpi-worker, never the gang's key, which
   this process fetches once (mpi_control.gang_token) and keeps in memory. OpenMPI is told not to tree-spawn
   (plm_rsh_no_tree_spawn: only the launcher's pod has a doorway), so mpirun starts every daemon itself.
4. It runs the MPI command: CMD itself when CMD starts with mpirun/mpiexec (the user's flags kept, ours inserted
   after the program name), else `mpirun -np <total slots> CMD` (OpenMPI), `mpiexec -n <total> CMD` (MPICH,
   Intel). Added: `--allow-run-as-root` for OpenMPI as root; `-localhost <own address>` for Hydra (MPICH, Intel),
   whose proxies dial the launcher back by that name; the implementation's hostfile/agent variables when missing.
   The ranks are pinned to the implementation the gang names (MPI_ABI_SELECTORS): an image or machine with two
   MPIs installed (Debian's mpich pulls in libmpich-dev, whose libmpi.so is MPICH's) must not have mpi4py pick
   the other one and fail under this mpirun.
5. Signals are forwarded to mpirun. A worker whose control connection drops stops the run (mpirun gets SIGTERM)
   and the launcher exits 129. Otherwise it exits with mpirun's code. Either way every worker is told the code
   and exits with it.
"""

from __future__ import annotations

import contextlib
import os
import select
import shlex
import shutil
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Mapping, Sequence

from trainhook.gang import keys
from trainhook.launcher import ending
from trainhook.launcher.mpi import kubexec as kubexec_module
from trainhook.launcher.mpi import control
from trainhook.launcher.mpi import gang_transport
from trainhook.launcher.mpi import worker as mpi_worker
from trainhook.gang import wiring as mpi
from trainhook.launcher.pod_view import ConfigError, GangView, Peer, parse_gang
from trainhook.launcher.policy import read_settings
from trainhook.launcher.process import SignalForwarder, exit_code, returncode
from trainhook.launcher.reach import describe, why
from trainhook.gang.wiring import Shape
from trainhook.launcher.speak import speaker
from trainhook.launcher.files import write_atomically

EXIT_WORKERS_MISSING = 1
EXIT_SETUP_FAILED = 2  # what the CLI exits with on a ConfigError; the workers get the same
EXIT_WORKER_LOST = control.EXIT_LAUNCHER_LOST  # 129: a member hung up mid-run; retryable
STOP_GRACE = 10.0
RETRY_DELAY = 0.5
MPI_PROGRAMS = {"mpirun", "mpiexec", "orterun", "mpiexec.hydra", "mpirun.openmpi", "mpiexec.openmpi",
                "mpirun.mpich", "mpiexec.mpich"}
# Which MPI library the ranks load, for bindings that choose at run time: mpi4py's wheels carry one extension per
# ABI and, unless told, take whatever `libmpi.so` is (MPICH's when libmpich-dev is installed beside Open MPI).
# A user's own value wins. Open MPI exports only what `-x` names to remote ranks; Hydra forwards every variable.
MPI4PY_MPIABI = "MPI4PY_MPIABI"
MPI_ABI_SELECTORS = {mpi.OPENMPI: "openmpi", mpi.INTEL: "mpich", mpi.MPICH: "mpich"}
# The program run for `trainhook-launch mpirun -- PROGRAM` per implementation, first found on PATH wins
# (Debian installs OpenMPI's and MPICH's side by side, with `mpirun` pointing at one of them).
MPI_BINARIES = {mpi.OPENMPI: ("mpirun.openmpi", "mpirun"), mpi.MPICH: ("mpiexec.mpich", "mpiexec.hydra", "mpiexec"),
                mpi.INTEL: ("mpiexec.hydra", "mpiexec")}


say = speaker("mpirun")


def shape_of(gang: GangView) -> Shape:
    counts: dict[str, int] = {}
    for peer in gang.peers:
        counts[peer.role] = counts.get(peer.role, 0) + 1
    return Shape(tuple(counts.items()))


def implementation_of(env: Mapping[str, str]) -> str:
    value = env.get(mpi.TH_MPI_IMPLEMENTATION, "").strip() or mpi.OPENMPI
    if value not in mpi.IMPLEMENTATIONS:
        raise ConfigError(f"{mpi.TH_MPI_IMPLEMENTATION}={value!r}: use one of {', '.join(mpi.IMPLEMENTATIONS)}")
    return value


def file_paths(implementation: str, env: Mapping[str, str]) -> tuple[Path, Path]:
    """(hostfile, agent script) at the paths the implementation's variables name, Kubeflow's by default."""
    hostfile_var, agent_var, _ = mpi.FILE_VARIABLES[implementation]
    return (Path(env.get(hostfile_var, "").strip() or mpi.HOSTFILE_PATH),
            Path(env.get(agent_var, "").strip() or mpi.AGENT_PATH))


def write_config_file(path: Path, text: str, mode: int) -> None:
    try:
        write_atomically(path, text.encode(), mode)
    except OSError as e:
        raise ConfigError(f"cannot write {path}: {e.strerror or e} (trainhook's webhook mounts an emptyDir at "
                          f"{mpi.CONFIG_MOUNT_PATH} in MPI pods; is the pod labeled and admitted?)") from e


OMPI_NO_TREE_SPAWN = "OMPI_MCA_plm_rsh_no_tree_spawn"


def launch_env(env: Mapping[str, str], implementation: str, slots: int, hostfile: Path, agent: Path,
               transport: str = control.DEFAULT_TRANSPORT) -> dict[str, str]:
    """mpirun's environment: ours, plus the implementation's variables where the webhook's are missing."""
    out = dict(env)
    if implementation == mpi.OPENMPI and transport == "gang":
        out.setdefault(OMPI_NO_TREE_SPAWN, "1")  # daemons that start daemons would need a doorway of their own
    for name, value in mpi.launcher_env(implementation, slots, gpus=1):  # GPU visibility is not ours to change
        out.setdefault(name, value)
    hostfile_var, agent_var, _ = mpi.FILE_VARIABLES[implementation]
    out[hostfile_var], out[agent_var] = str(hostfile), str(agent)
    out.setdefault(MPI4PY_MPIABI, MPI_ABI_SELECTORS[implementation])
    if implementation == mpi.OPENMPI and os.geteuid() == 0:
        out.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        out.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return out


def find_binary(implementation: str, path: str | None) -> str:
    for name in MPI_BINARIES[implementation]:
        found = shutil.which(name, path=path)
        if found:
            return name
    raise ConfigError(f"no {implementation} launcher on PATH (looked for {', '.join(MPI_BINARIES[implementation])})")


def build_command(cmd: Sequence[str], implementation: str, total_slots: int, address: str, root: bool,
                  path: str | None = None) -> list[str]:
    """The MPI command line: the user's own mpirun/mpiexec with our flags inserted, or one built around CMD."""
    passthrough = os.path.basename(cmd[0]) in MPI_PROGRAMS
    given = set(cmd[1:]) if passthrough else set()
    extras: list[str] = []
    if implementation == mpi.OPENMPI:
        if root and "--allow-run-as-root" not in given:
            extras.append("--allow-run-as-root")
        if MPI4PY_MPIABI not in given:
            extras += ["-x", MPI4PY_MPIABI]
    elif "-localhost" not in given:
        extras += ["-localhost", address]
    if passthrough:
        return [cmd[0], *extras, *cmd[1:]]
    count = ["-np", str(total_slots)] if implementation == mpi.OPENMPI else ["-n", str(total_slots)]
    return [find_binary(implementation, path), *extras, *count, *cmd]


def reach_workers(gang: GangView, workers: Sequence[Peer], port: int, timeout: float,
                  token: bytes, setup: control.Setup) -> tuple[dict[int, control.WorkerLink], dict[int, str]]:
    """Connect to every worker, retrying until the deadline or a refusal; (links by rank, last error by missing
    rank)."""
    links: dict[int, control.WorkerLink] = {}
    errors: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    last_report = 0.0

    refused = False

    def attempt(peer: Peer) -> tuple[Peer, control.WorkerLink | None, str]:
        nonlocal refused
        try:
            return peer, control.connect_worker(gang, peer, port, token, setup), ""
        except ConnectionRefusedError as e:
            return peer, None, f"{why(e)} (is it running `trainhook-launch mpi-worker`?)"
        except OSError as e:
            return peer, None, why(e)
        except control.WorkerRefused as e:
            refused = True
            return peer, None, str(e)
        except control.ControlError as e:
            return peer, None, str(e)

    with ThreadPoolExecutor(max_workers=min(32, max(1, len(workers)))) as pool:
        while True:
            pending = [w for w in workers if w.rank not in links]
            for peer, link, error in pool.map(attempt, pending):
                if link is not None:
                    links[peer.rank] = link
                    errors.pop(peer.rank, None)
                else:
                    errors[peer.rank] = error
            missing = [w for w in workers if w.rank not in links]
            if not missing or refused or time.monotonic() >= deadline:
                return links, errors
            if time.monotonic() - last_report >= 30:
                last_report = time.monotonic()
                say(f"{len(links)}/{len(workers)} workers reachable; waiting for {describe(missing)}")
            time.sleep(RETRY_DELAY)


class Watch:
    """Watches the workers' control connections while mpirun runs; the first to drop stops mpirun."""

    def __init__(self, links: Sequence[control.WorkerLink], stop: Callable[[], None]):
        self.links = list(links)
        self.stop_mpirun = stop
        self.lost: list[control.WorkerLink] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        while not self.done.is_set():
            live = [link for link in self.links if not link.channel.closed]
            if not live:
                return
            readable, _, _ = select.select([link.channel for link in live], [], [], 0.2)
            for link in live:
                if link.channel in readable and not link.channel.feed() and not self.done.is_set():
                    link.lost = True
                    self.lost.append(link)
                    say(f"worker {link.peer} went away (its control connection closed); stopping mpirun")
                    self.stop_mpirun()

    def finish(self) -> None:
        self.done.set()
        self.thread.join(timeout=2)


def run_mpi(argv: Sequence[str], env: Mapping[str, str], links: Sequence[control.WorkerLink],
            doorway: gang_transport.Doorway | None = None) -> tuple[int, bool]:
    """Run mpirun with signals forwarded and the workers watched; (exit code, whether a worker was lost)."""
    stopping = threading.Event()
    forward = SignalForwarder()

    def stop() -> None:
        if stopping.is_set() or forward.child is None:
            return
        stopping.set()
        forward(signal.SIGTERM)
        timer = threading.Timer(STOP_GRACE, lambda: forward(signal.SIGKILL))
        timer.daemon = True
        timer.start()

    watch = Watch(links, stop)
    with forward, (doorway or contextlib.nullcontext()):
        try:
            try:
                child = subprocess.Popen(list(argv), env=dict(env))
            except OSError as e:
                say(f"cannot start {argv[0]}: {e.strerror or e}")
                return 127 if isinstance(e, FileNotFoundError) else 126, False
            forward.attach(child)
            watch.start()
            status = forward.wait(child.pid, reap_all=os.getpid() == 1)
            child.returncode = returncode(status)
            return exit_code(status), bool(watch.lost)
        finally:
            watch.finish()


def tell_workers(links: Sequence[control.WorkerLink], code: int, why_text: str) -> None:
    for link in links:
        link.tell_exit(code, why_text)
    for link in links:
        link.wait_bye(timeout=5.0)


def launch(gang: GangView, env: Mapping[str, str], cmd: Sequence[str]) -> int:
    if gang.framework != keys.MPI:
        raise ConfigError(f"{keys.TH_FRAMEWORK}={gang.framework!r}: mpirun is for {keys.MPI} gangs "
                          f"(label the workload {keys.FRAMEWORK}={keys.MPI})")
    shape = shape_of(gang)
    if not mpi.is_launcher(gang.role, gang.index, shape):
        say(f"this pod is {gang.me}, not the launcher: serving as a worker (the command runs from the launcher)")
        return mpi_worker.serve(gang, env)
    if not cmd:
        raise ConfigError("mpirun needs a command: trainhook-launch mpirun -- CMD [ARGS ...]")
    implementation = implementation_of(env)
    transport, run_dir = kubexec_module.choose_transport("", env)
    port = control.control_port(gang)
    own_slots = mpi_worker.own_slots(env)
    workers = [p for p in gang.peers if p.role == mpi.WORKER]
    remote = [w for w in workers if w.rank != gang.rank]
    hostfile_path, agent_path = file_paths(implementation, env)
    say(f"{implementation}, {transport} transport: reaching {len(remote)} worker(s) on port {port}")
    setup = control.Setup(transport, str(agent_path), str(run_dir or ""))
    started = time.monotonic()
    key = control.gang_token(env)  # once: kept in this process's memory, handed to no child
    if not key and remote:
        # Every transport's control channel is signed with the key, and no worker accepts an empty one (issue 31).
        raise ConfigError("no gang key (the notary gave none, see above): no worker accepts a launcher without one; "
                          f"fix the notary ({keys.TH_NOTARY})")
    links, errors = reach_workers(gang, remote, port, gang.wait_timeout, key, setup)
    missing = [w for w in remote if w.rank not in links]
    if missing:
        detail = "; ".join(f"{w}: {errors.get(w.rank, 'not reached')}" for w in missing[:8])
        more = f"; and {len(missing) - 8} more" if len(missing) > 8 else ""
        say(f"{len(missing)} of {len(remote)} worker(s) not reachable after {time.monotonic() - started:.0f}s "
            f"(deadline {gang.wait_timeout:g}s): {detail}{more}")
        tell_workers(list(links.values()), EXIT_WORKERS_MISSING, "the launcher gave up waiting for other workers")
        return EXIT_WORKERS_MISSING
    ordered = [links[w.rank] for w in remote]
    slots = {rank: link.slots for rank, link in links.items()}
    slots[gang.rank] = own_slots
    hosts = [(w.address, slots[w.rank]) for w in workers]
    try:
        if transport == "gang" and not key:  # a launcher alone (no remote worker): its doorway serves nobody
            raise ConfigError("no gang key (no notary answered, see above): the gang transport starts nothing "
                              f"without one; fix the notary ({keys.TH_NOTARY})")
        write_config_file(hostfile_path, mpi.hostfile(hosts, implementation), 0o644)
        doorway_path = gang_transport.doorway_path(agent_path) if transport == "gang" else None
        write_config_file(agent_path, kubexec_module.agent_script(transport, run_dir, doorway_path), 0o755)
        total = sum(count for _, count in hosts)
        argv = build_command(cmd, implementation, total, gang.address, os.geteuid() == 0, env.get("PATH"))
    except ConfigError as e:
        tell_workers(ordered, EXIT_SETUP_FAILED, f"the launcher could not start: {e}")
        raise
    child_env = launch_env(env, implementation, own_slots, hostfile_path, agent_path, transport)
    doorway = gang_transport.Doorway(gang, key, port, doorway_path, say) if doorway_path is not None else None
    say(f"hostfile {hostfile_path}: {', '.join(f'{a} ({n})' for a, n in hosts)}")
    say(f"running: {shlex.join(argv)}")
    try:
        code, lost = run_mpi(argv, child_env, ordered, doorway)
    except OSError as e:  # the doorway could not be opened
        tell_workers(ordered, EXIT_SETUP_FAILED, f"the launcher could not start: {e}")
        raise ConfigError(f"cannot serve the rsh agents' doorway {doorway_path}: {e.strerror or e}") from e
    if lost:
        say(f"{argv[0]} exited with {code} after a worker went away; exiting {EXIT_WORKER_LOST}")
        code = EXIT_WORKER_LOST
        why_text = "a worker went away mid-run"
    else:
        say(f"{argv[0]} exited with {code}")
        why_text = f"{os.path.basename(argv[0])} exited with {code}"
    tell_workers([link for link in ordered if not link.lost], code, why_text)
    return code


def end_gang(gang: GangView, env: Mapping[str, str], code: int) -> int:
    """mpirun has ended (or the launcher told this worker how): the gang is done. Every member ends as `run`'s
    members do (ending.py): the first of each role records the outcome on its workload and scales a StatefulSet
    to zero, and a StatefulSet's pods park instead of exiting, so a finished MPI gang never trains again."""
    settings = read_settings(env, gang)
    shape = shape_of(gang)
    launcher = next((p for p in gang.peers if mpi.is_launcher(p.role, p.index, shape)), gang.peers[0])
    reason = f"the MPI launcher, {launcher}, ended the gang with exit {code}"
    return ending.end_member(gang, settings, ending.outcome_of(code, reason, launcher.rank), code, say)


def main(cmd: Sequence[str]) -> int:
    gang = parse_gang(os.environ)
    return end_gang(gang, os.environ, launch(gang, os.environ, cmd))


def worker_main(cmd: Sequence[str]) -> int:
    gang = parse_gang(os.environ)
    if gang.framework != keys.MPI:
        raise ConfigError(f"{keys.TH_FRAMEWORK}={gang.framework!r}: mpi-worker is for {keys.MPI} gangs")
    return end_gang(gang, os.environ, mpi_worker.serve(gang, os.environ, cmd))
