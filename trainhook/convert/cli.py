"""`trainhook convert FILE`: print the trainhook manifests of a Kubeflow job (v1 kinds, or a Trainer v2 TrainJob
with its runtime); warnings go to stderr."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainhook.gang import keys
from trainhook.convert.core import ConvertError, load_documents, parse_entrypoint_option
from trainhook.convert.runtimes import BUILTIN, is_runtime
from trainhook.convert.stream import convert_text
from trainhook.render.objects import KINDS, to_yaml


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Convert Kubeflow PyTorchJob, TFJob, XGBoostJob, JAXJob, PaddleJob and MPIJob (v1, and "
                          "mpi-operator's v2beta1) and Kubeflow Trainer v2 TrainJobs into trainhook manifests: a "
                          "headless Service and one labeled workload per replica type. Fields without a trainhook "
                          "counterpart are named on stderr.")
    parser.add_argument("file", help="a YAML file with Kubeflow jobs ('-': standard input); other objects pass through")
    parser.add_argument("--kind", default="statefulset", choices=KINDS,
                        help="one StatefulSet per replica type (default, any Kubernetes) or one Indexed Job "
                             "(Kubernetes >= 1.21)")
    parser.add_argument("--gang-scheduler", choices=keys.GANG_SCHEDULERS,
                        help="map runPolicy.schedulingPolicy for this scheduler (default: what the job names: "
                             "Kueue's queue-name label, a volcano or scheduler-plugins schedulerName)")
    parser.add_argument("-n", "--namespace", help="the namespace of jobs that name none")
    parser.add_argument("-o", "--output", metavar="FILE", help="write the manifests here instead of stdout")
    parser.add_argument("--runtime", metavar="FILE", action="append", default=[],
                        help="a ClusterTrainingRuntime or TrainingRuntime manifest for the TrainJobs that name it "
                             "(repeatable; runtimes in FILE itself serve too); without one, a TrainJob may name "
                             f"Trainer's built-in {', '.join(BUILTIN)}")
    parser.add_argument("--entrypoint", metavar="JSON",
                        help="the image's ENTRYPOINT as a JSON list, e.g. '[\"python\", \"/app/train.py\"]': the "
                             "command of training containers that have none (the webhook cannot read an image's; "
                             "without this, such a job is refused)")


def read_runtimes(path: str) -> list[dict]:
    """The training runtimes of a `--runtime` file; anything else in it is refused (it would be lost silently)."""
    objects = load_documents(Path(path).read_text(encoding="utf-8"), path)
    others = [f"{o.get('kind')}/{(o.get('metadata') or {}).get('name', '?')}" for o in objects if not is_runtime(o)]
    if others or not objects:
        raise ConvertError(f"--runtime {path}: holds {', '.join(others) or 'nothing'}, not only ClusterTrainingRuntime "
                           f"or TrainingRuntime manifests (trainer.kubeflow.org); give the TrainJob as FILE")
    return objects


def main(args: argparse.Namespace) -> int:
    try:
        if args.file == "-":
            text, path = sys.stdin.read(), "<stdin>"
        else:
            text, path = Path(args.file).read_text(encoding="utf-8"), args.file
        entrypoint = parse_entrypoint_option(args.entrypoint) if args.entrypoint is not None else None
        runtimes = [runtime for name in args.runtime for runtime in read_runtimes(name)]
        converted = convert_text(text, path, args.kind, args.gang_scheduler, args.namespace, entrypoint, runtimes)
    except OSError as e:
        print(f"error: cannot read {e.filename or args.file}: {e.strerror or e}", file=sys.stderr)
        return 1
    except ConvertError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for warning in converted.warnings:
        print(f"Warning: {warning}", file=sys.stderr)
    output = to_yaml(converted.objects)
    if args.output:
        Path(args.output).write_text(output, encoding="utf-8")
    else:
        sys.stdout.write(output)
    return 0
