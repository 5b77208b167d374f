"""`trainhook-launch`: the in-pod launcher's command line (contract section 6).

Each subcommand lives in its own module; this file only parses arguments and turns a ConfigError (a user's or
a webhook's mistake) into one line on stderr and exit code 2, never a traceback. `run` and `torchrun` pass
everything after their name through untouched, because the wrapped command's own flags are not ours to parse.
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

from trainhook.gang import keys
from trainhook.launcher.pod_view import ConfigError, parse_gang

TYPE_CHECKING = False  # typing's own, without importing typing (trainhook/launcher/__init__.py says why)
if TYPE_CHECKING:
    from typing import Sequence
    import argparse

# The modules behind the commands are imported when their command runs: the gang-wait init container starts
# once in every pod, beside the training's own start, and the MPI launcher's modules alone took 30 ms of it.
# argparse too, with the parser of every command: `run -- CMD` and the other pass-through commands have nothing
# for it to parse, and every training container's launcher starts with one (issue 26: a start is CPU, and 25 of
# them share a node's 2 cores).

EXIT_USAGE = 2
PASSTHROUGH: tuple[str, ...] = ("run", "torchrun")  # subcommands whose arguments belong to the command they start
# The MPI commands pass everything through too: mpirun's flags, the worker's service, and the ssh-style
# options mpirun gives its rsh agent (`-o ConnectionAttempts=10 HOST ...`).
PASSTHROUGH += ("mpirun", "mpi-worker", "kubexec")

DESCRIPTION = """\
The in-pod side of trainhook. The webhook injects TRAINHOOK_* variables (and the framework's own, such as
MASTER_ADDR or TF_CONFIG) into every pod of a training gang; these commands use them, with no API call."""

WAIT_HELP = f"""\
Block until the whole gang is there; run by the gang-wait init container the webhook adds.
dns: every member's address resolves. tcp: also every member's gang-wait accepts a connection from every
other (a symmetric barrier on port {keys.TH_GANG_WAIT_PORT}, default {keys.GANG_WAIT_PORT}; it never
touches the training port, which nothing listens on yet). On the deadline it exits 1 naming the members
still missing. Defaults come from {keys.TH_GANG_WAIT}, {keys.TH_WAIT_TIMEOUT} and {keys.TH_GANG_WAIT_PORT}."""

INSTALL_HELP = f"""\
Write the delivered launcher into DIR: DIR/launcher.pyz (the in-pod modules, standard library only, Python 3.8+)
and DIR/bin/trainhook-launch (a shell script that runs it with the image's own python3, isolated). The webhook's
init container runs it into the emptyDir {keys.LAUNCHER_VOLUME}, which the training container mounts read-only at
{keys.LAUNCHER_DIR}. See docs/use/delivery.md."""

RUN_HELP = """\
Run CMD as a child: SIGTERM, SIGINT, SIGHUP, SIGUSR1 and SIGUSR2 are forwarded to it, orphaned processes are
reaped when the launcher is the container's PID 1, and the exit code is CMD's own (128+N when CMD is killed
by signal N, as a shell reports it; 127 when CMD does not exist).
In a gang (TRAINHOOK_* set by the webhook) the members' launchers coordinate through rank 0's (port 29497,
messages signed with the gang's key, which the notary at TRAINHOOK_NOTARY gives each member's launcher for its
pod's identity token): the training starts on every member together; when rank 0 exits 0
the gang succeeded and every member's training ends; when a member fails, every member's training is stopped
(TRAINHOOK_ON_FAILURE=fail-gang) or restarted together with a fresh rendezvous (restart-gang, codes >= 128,
up to TRAINHOOK_MAX_RESTARTS times). Then Job pods exit (0, or the gang's code) and StatefulSet pods park
without rerunning the training; rank 0's launcher records the outcome through the notary, which annotates the
workloads, scales a StatefulSet to zero and emits an Event. See docs/use/gang-lifecycle.md."""

TORCHRUN_HELP = f"""\
Run torchrun (python -m torch.distributed.run) with --nnodes, --nproc-per-node, --node-rank, --master-addr and
--master-port taken from {keys.PET_NNODES}, {keys.PET_NPROC_PER_NODE}, {keys.PET_NODE_RANK} (or {keys.RANK}),
{keys.PET_MASTER_ADDR} (or {keys.MASTER_ADDR}) and {keys.PET_MASTER_PORT} (or {keys.MASTER_PORT}); for an
elastic gang ({keys.PET_RDZV_BACKEND} set), --rdzv-backend, --rdzv-endpoint, --rdzv-id and --max-restarts
instead. torchrun flags given before SCRIPT win over the environment, e.g.
  trainhook-launch torchrun --nproc-per-node 2 train.py --epochs 3
The command is printed to stderr, then run as `run` runs a command (signals forwarded, exit code kept)."""


TF_CONFIG_HELP = f"""\
Print this pod's TF_CONFIG on stdout, built from {keys.TH_REPLICAS}, {keys.TH_HOSTS}, {keys.TH_SUBDOMAIN},
{keys.TH_ROLE}, {keys.TH_INDEX} and {keys.TH_PORT}: the same JSON the webhook injects, e.g.
  export TF_CONFIG="$(trainhook-launch tf-config)"
A gang of one pod prints {{}} (no cluster: TensorFlow trains locally), as a Kubeflow TFJob with one
replica gets no TF_CONFIG."""

KUBEXEC_HELP = """\
The rsh agent mpirun starts its remote daemons with (the webhook points OMPI_MCA_plm_rsh_agent,
I_MPI_HYDRA_BOOTSTRAP_EXEC and HYDRA_LAUNCHER_EXEC at /etc/mpi/kubexec.sh, which `trainhook-launch mpirun`
writes to call this). Runs CMD in POD as `/bin/sh -c "CMD ARGS"`, like ssh, through the transport chosen by
--transport or TRAINHOOK_MPI_TRANSPORT: gang (the default: POD's own `mpi-worker` runs it, asked through the
launcher's doorway over the gang's authenticated port; no API permission, no sshd), kubexec (the Kubernetes exec
API with the pod's ServiceAccount; needs a per-gang exec Role), ssh (keys from a Secret, sshd in the workers) or
local (a pod of `trainhook local`). ssh-style options before HOST are accepted (and passed to ssh). Exits with
CMD's code, or 255 when it could not run CMD, with one line saying why."""

MPIRUN_HELP = """\
The launcher of an MPI gang (the `launcher` pod, or worker 0 of a gang without one; on any other pod it serves
as a worker). Connects to every worker's `mpi-worker` (deadline: $TRAINHOOK_WAIT_TIMEOUT, then exit 1 naming
the missing ones), writes the hostfile and the rsh agent at the paths the webhook's variables name
(/etc/mpi/hostfile, /etc/mpi/kubexec.sh), and runs CMD: as given when it starts with mpirun/mpiexec (e.g.
`trainhook-launch mpirun -- mpirun -np 4 python train.py`), else `mpirun -np <total slots> CMD`. Adds
--allow-run-as-root (OpenMPI, as root) and -localhost <own address> (Hydra). Exits with mpirun's code (129 when
a worker went away mid-run) and tells every worker to exit with it. Transport: $TRAINHOOK_MPI_TRANSPORT
(gang, kubexec, ssh, local), else gang."""

MPI_WORKER_HELP = """\
An MPI worker pod's command: listens on the gang's port ($TRAINHOOK_PORT, else 29498) for the launcher,
reports its slots ($TRAINHOOK_MPI_SLOTS), keeps the pod up while mpirun's daemons run in it, and exits with the
launcher's outcome; 129 when the launcher goes away or never comes (within $TRAINHOOK_WAIT_TIMEOUT). SERVICE
runs beside it for its lifetime, e.g. `trainhook-launch mpi-worker -- /usr/sbin/sshd -De` for the ssh transport."""


def build_parser() -> argparse.ArgumentParser:
    import argparse  # only where there is something to parse (see above)
    parser = argparse.ArgumentParser(prog="trainhook-launch", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, summary: str, text: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=summary, description=text,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)

    wait = add("wait", "block until every member of the gang is there (the gang-wait init container)", WAIT_HELP)
    wait.add_argument("--mode", choices=keys.GANG_WAIT_MODES,
                      help=f"what to wait for (default: ${keys.TH_GANG_WAIT} or dns)")
    wait.add_argument("--timeout", type=float, metavar="SECONDS",
                      help=f"give up after this long (default: ${keys.TH_WAIT_TIMEOUT} or 600)")
    wait.add_argument("--port", type=int, metavar="PORT",
                      help=f"the tcp barrier's port (default: ${keys.TH_GANG_WAIT_PORT} or {keys.GANG_WAIT_PORT})")
    wait.add_argument("--install", metavar="DIR",
                      help="first deliver the launcher into DIR, as `install DIR` does (one init container does both)")
    install = add("install", "deliver the launcher into DIR (the pod's launcher volume)", INSTALL_HELP)
    install.add_argument("directory", metavar="DIR")
    run = add("run", "run the training command: signals forwarded, orphans reaped, exit code kept", RUN_HELP)
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS ...]")
    torchrun = add("torchrun", "torchrun with --nnodes, --node-rank, --master-addr... from the environment",
                   TORCHRUN_HELP)
    torchrun.add_argument("cmd", nargs=argparse.REMAINDER, metavar="[TORCHRUN FLAGS] [--] SCRIPT [ARGS ...]")
    add("tf-config", "print this pod's TF_CONFIG (the JSON the webhook injects)", TF_CONFIG_HELP)
    mpirun = add("mpirun", "MPI launcher: wait for the workers, write the hostfile, run mpirun, tell the workers",
                 MPIRUN_HELP)
    mpirun.add_argument("cmd", nargs=argparse.REMAINDER, metavar="[--] CMD [ARGS ...]")
    mpi_worker = add("mpi-worker", "MPI worker: stay up for the launcher's daemons, then exit with its outcome",
                     MPI_WORKER_HELP)
    mpi_worker.add_argument("cmd", nargs=argparse.REMAINDER, metavar="[-- SERVICE [ARGS ...]]")
    kubexec = add("kubexec", "the MPI rsh agent: run CMD in POD through its mpi-worker (or exec API, ssh, local pod)",
                  KUBEXEC_HELP)
    kubexec.add_argument("cmd", nargs=argparse.REMAINDER, metavar="[--transport T] [SSH OPTIONS] POD [--] CMD ...")
    return parser


def do_install(args: argparse.Namespace) -> int:
    from trainhook.launcher import deliver
    return deliver.main(args.directory)


def do_wait(args: argparse.Namespace) -> int:
    """Flags become the variables they stand for, so one parser validates both and errors name one thing."""
    if args.install is not None:
        from trainhook.launcher import deliver
        installed = deliver.main(args.install)
        if installed != 0:
            return installed
    env = dict(os.environ)
    for flag, name in (("mode", keys.TH_GANG_WAIT), ("timeout", keys.TH_WAIT_TIMEOUT),
                       ("port", keys.TH_GANG_WAIT_PORT)):
        if getattr(args, flag) is not None:
            env[name] = str(getattr(args, flag))
    from trainhook.launcher.wait import command as wait_module
    return wait_module.wait(parse_gang(env))


def do_run(args: argparse.Namespace) -> int:
    if not args.cmd:
        raise ConfigError("run needs a command: trainhook-launch run -- CMD [ARGS ...]")
    from trainhook.launcher import run as run_module
    return run_module.run(args.cmd)


def do_torchrun(args: argparse.Namespace) -> int:
    from trainhook.launcher import torchrun as torchrun_module
    return torchrun_module.main(args.cmd)


def do_mpirun(args: argparse.Namespace) -> int:
    from trainhook.launcher.mpi import launch as mpi_launch
    return mpi_launch.main(args.cmd)


def do_mpi_worker(args: argparse.Namespace) -> int:
    from trainhook.launcher.mpi import launch as mpi_launch
    return mpi_launch.worker_main(args.cmd)


def do_tf_config(args: argparse.Namespace) -> int:
    from trainhook.launcher import tf_config as tf_config_module
    return tf_config_module.main(args)


def do_kubexec(args: argparse.Namespace) -> int:
    from trainhook.launcher.mpi import kubexec as kubexec_module
    return kubexec_module.main(args.cmd)


HANDLERS = {"wait": do_wait, "install": do_install, "run": do_run, "torchrun": do_torchrun,
            "tf-config": do_tf_config, "mpirun": do_mpirun, "mpi-worker": do_mpi_worker, "kubexec": do_kubexec}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in PASSTHROUGH and argv[1:2] not in (["-h"], ["--help"]):
        # argparse would try to read the wrapped command's own flags (`torchrun --nproc-per-node 2 x.py`), and
        # the command's name is all there is to parse: no parser (what parse_args(argv[:1]) gave, field for field).
        args: argparse.Namespace = SimpleNamespace(  # type: ignore[assignment]
            command=argv[0], cmd=argv[2:] if argv[1:2] == ["--"] else argv[1:])
    else:
        args = build_parser().parse_args(argv)
    try:
        return HANDLERS[args.command](args)
    except ConfigError as e:
        print(f"trainhook-launch {args.command}: error: {e}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
