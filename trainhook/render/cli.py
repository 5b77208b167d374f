"""The flags of `trainhook render` (and of `trainhook submit` without a manifest), and `render`'s main."""

from __future__ import annotations

import argparse
import shlex
import sys

from trainhook.gang import keys
from trainhook.render.objects import KINDS, ON_FAILURE_POLICIES, RenderError, Scheduling, to_yaml
from trainhook.render.options import RenderOptions, parse_env, parse_roles, render

EPILOG = """\
The training command comes last, after `--` (or as one string with --command):
  trainhook render ddp --framework pytorch --workers 4 --image pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime \\
      --gpus 1 -- torchrun /workspace/train.py --epochs 3
Multi-role gangs: --role master=1 --role worker=3 (one workload per role, named <name>-<role>)."""


def add_gang_arguments(parser: argparse.ArgumentParser, name_required: bool = True) -> None:
    """Every flag that shapes a gang; the command itself is what follows `--` on the command line."""
    if name_required:
        parser.add_argument("name", help="the gang's name: the Service, the workloads and the pods are named after it")
    parser.add_argument("--framework", default=keys.PYTORCH, choices=[f for f in keys.ROLES if f != keys.MXNET],
                        help="default: pytorch")
    parser.add_argument("--workers", type=int, metavar="N", help="the number of worker pods")
    parser.add_argument("--role", action="append", default=[], metavar="ROLE=N",
                        help="a role and its pod count, e.g. --role master=1 --role worker=3 (repeatable)")
    parser.add_argument("--image", help="the training container's image (required)")
    parser.add_argument("--command", dest="command_string", metavar="'CMD ARGS'",
                        help="the training command as one shell-quoted string (or give it after --)")
    parser.add_argument("--gpus", type=int, default=0, metavar="N", help="nvidia.com/gpu per pod (a limit)")
    parser.add_argument("--cpu", default="", metavar="QUANTITY", help="CPU per pod (a request), e.g. 4 or 500m")
    parser.add_argument("--memory", default="", metavar="QUANTITY",
                        help="memory per pod (request and limit), e.g. 16Gi")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment variable of the training container (repeatable)")
    parser.add_argument("--container", default="", metavar="NAME",
                        help="the training container's name (default: the framework's, as Kubeflow names it)")
    parser.add_argument("--nproc-per-node", default="", metavar="auto|cpu|gpu|N",
                        help="processes per pod for torchrun (default auto: the GPU count, or 1)")
    parser.add_argument("--port", type=int, metavar="PORT", help="the master/coordinator port (default: per framework)")
    parser.add_argument("--elastic", default="", metavar="MIN:MAX",
                        help="PyTorch elastic training between MIN and MAX pods")
    parser.add_argument("--on-failure", default="", choices=ON_FAILURE_POLICIES,
                        help="when a member fails: fail the gang (default) or restart it as one")
    parser.add_argument("--max-restarts", type=int, metavar="N",
                        help="restarts allowed (restart-gang; PyTorch elastic)")
    parser.add_argument("--active-deadline-seconds", type=int, metavar="SECONDS", help="end a run that lasts longer")
    parser.add_argument("-n", "--namespace", help="the objects' namespace (default: none written, kubectl's current)")
    parser.add_argument("--kind", default="statefulset", choices=KINDS,
                        help="one StatefulSet per role (default, any Kubernetes) or one Indexed Job per role "
                             "(Kubernetes >= 1.21)")
    group = parser.add_argument_group("gang scheduling")
    group.add_argument("--gang-scheduler", choices=keys.GANG_SCHEDULERS,
                       help="hand the gang to Kueue, Volcano or the coscheduling plugin (a PodGroup is emitted "
                            "for the latter two)")
    group.add_argument("--queue", default="", help="Kueue LocalQueue or Volcano queue")
    group.add_argument("--min-available", type=int, metavar="N",
                       help="pods that must be placeable together (default: all)")
    group.add_argument("--priority-class", default="", metavar="NAME",
                       help="the pods' (and Volcano PodGroup's) PriorityClass")
    group.add_argument("--scheduler-name", default="", metavar="NAME",
                       help=f"coscheduling: the scheduler profile's name (default {keys.COSCHEDULING_SCHEDULER})")
    group.add_argument("--schedule-timeout-seconds", type=int, metavar="SECONDS",
                       help="coscheduling: how long the PodGroup's pods wait for each other")


def scheduling_from_args(args: argparse.Namespace) -> Scheduling | None:
    scheduler = getattr(args, "gang_scheduler", None)
    given = [flag for flag, value in (("--queue", args.queue), ("--min-available", args.min_available),
                                      ("--priority-class", args.priority_class),
                                      ("--scheduler-name", args.scheduler_name),
                                      ("--schedule-timeout-seconds", args.schedule_timeout_seconds)) if value]
    if not scheduler:
        if args.priority_class and given == ["--priority-class"]:
            return None  # a priority class alone needs no gang scheduler: render sets it on the pods
        if given:
            raise RenderError(f"{', '.join(given)}: give --gang-scheduler kueue|volcano|coscheduling too")
        return None
    return Scheduling(scheduler=scheduler, queue=args.queue, min_available=args.min_available,
                      priority_class=args.priority_class, scheduler_name=args.scheduler_name,
                      schedule_timeout_seconds=args.schedule_timeout_seconds)


def options_from_args(args: argparse.Namespace, name: str | None = None) -> RenderOptions:
    command = list(getattr(args, "command_argv", None) or [])
    if args.command_string:
        if command:
            raise RenderError("give the command either with --command or after --, not both")
        command = shlex.split(args.command_string)
    scheduling = scheduling_from_args(args)
    return RenderOptions(
        name=name or args.name, framework=args.framework, roles=parse_roles(args.workers, args.role, args.framework),
        image=args.image or "", command=command, gpus=args.gpus, cpu=args.cpu, memory=args.memory,
        env=parse_env(args.env), elastic=args.elastic, on_failure=args.on_failure, max_restarts=args.max_restarts,
        active_deadline_seconds=args.active_deadline_seconds, nproc_per_node=args.nproc_per_node, port=args.port,
        namespace=args.namespace, kind=args.kind, scheduling=scheduling, container=args.container,
        priority_class=args.priority_class)


def rendered(args: argparse.Namespace, name: str | None = None) -> list[dict]:
    return render(options_from_args(args, name))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Print the manifests of a training gang: a headless Service, one StatefulSet (or "
                          "Indexed Job) per role labeled for trainhook's webhook, and the PodGroup a gang "
                          "scheduler needs.")
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add_gang_arguments(parser)


def main(args: argparse.Namespace) -> int:
    try:
        objects = rendered(args)
    except RenderError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(to_yaml(objects))
    return 0
