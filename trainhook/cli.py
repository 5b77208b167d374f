"""`trainhook`: the user's CLI. Each subcommand lives in its own module; this file only wires them.

A module wired here offers `add_arguments(parser)` and `main(args) -> exit status` (or `add_NAME_arguments` and
`NAME_main` when it serves several subcommands), and keeps heavy imports (the Kubernetes client) inside its
functions, so `trainhook render` never loads them. For `render` and `submit`, everything after the first `--`
is the training command, kept verbatim as `args.command_argv`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

# subcommand -> (module, help); each module has add_arguments(parser) and main(args).
SUBCOMMANDS = {
    "render": ("trainhook.render.cli", "print a training gang's manifests from flags"),
    "explain": ("trainhook.render.explain", "show, offline, the environment the webhook injects into every pod"),
    "convert": ("trainhook.convert.cli", "turn a Kubeflow PyTorchJob/TFJob/MPIJob/... into trainhook manifests"),
    "submit": ("trainhook.cluster.commands", "create a gang on the cluster (a manifest, or render's flags)"),
    "status": ("trainhook.cluster.commands", "a gang's pods, ranks, phases, restarts and outcome"),
    "list": ("trainhook.cluster.commands", "the gangs of a namespace"),
    "logs": ("trainhook.cluster.commands", "every pod's log, each line prefixed with its pod"),
    "delete": ("trainhook.cluster.commands", "delete a gang's workloads, Service, pods and PodGroup"),
}
# Subcommands whose arguments end with the training command after `--`.
COMMAND_TAKING = ("render", "submit")


def version(distribution: str = "trainhook") -> str:
    """The installed package's version; from a source tree that is not installed, pyproject.toml's."""
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        import tomllib

        try:
            with open(Path(__file__).resolve().parents[1] / "pyproject.toml", "rb") as f:
                return str(tomllib.load(f)["project"]["version"])
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "unknown (neither installed nor in its source tree)"


def certs_generate(args: argparse.Namespace) -> int:
    from trainhook.certs.build import write_bundle

    out = write_bundle(Path(args.out), args.san)
    print(f"wrote {out}/ca.crt, {out}/tls.crt, {out}/tls.key for {', '.join(args.san)}")
    return 0


def local_main(args: argparse.Namespace) -> int:
    from trainhook.local.cli import main

    return main(args)


def subcommand_main(args: argparse.Namespace) -> int:
    module = importlib.import_module(SUBCOMMANDS[args.command][0])
    runner = getattr(module, f"{args.command}_main", None) or module.main
    return runner(args)


def add_subcommand(commands, name: str) -> None:
    module_name, help_text = SUBCOMMANDS[name]
    parser = commands.add_parser(name, help=help_text)
    module = importlib.import_module(module_name)
    adder = getattr(module, f"add_{name}_arguments", None) or module.add_arguments
    adder(parser)
    parser.set_defaults(func=subcommand_main)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trainhook", description=(
        "Distributed training on plain Kubernetes workloads: label a StatefulSet or an Indexed Job and "
        "trainhook's webhook wires the gang."))
    parser.add_argument("--version", action="version", version=f"trainhook {version()}")
    commands = parser.add_subparsers(dest="command", required=True)

    certs = commands.add_parser("certs", help="certificates for the webhook's TLS")
    certs_commands = certs.add_subparsers(dest="certs_command", required=True)
    generate = certs_commands.add_parser("generate", help="write ca.crt, tls.crt and tls.key (a TLS Secret's keys)")
    generate.add_argument("--out", required=True, help="directory to write into (created if missing)")
    generate.add_argument("--san", action="append", required=True,
                          help="a DNS name or IP the serving certificate is valid for (repeatable)")
    generate.set_defaults(func=certs_generate)

    local = commands.add_parser("local", help="run a manifest's gang on this machine through the real webhook",
                                description="Run a labeled manifest's training gang on this machine: the real "
                                            "webhook mutates every pod, each pod runs as local processes in its own "
                                            "network namespace.")
    try:
        from trainhook.local.cli import add_arguments
    except ImportError:  # pragma: no cover - only while the local runner is absent from a broken install
        local.add_argument("manifest")
    else:
        add_arguments(local)
    local.set_defaults(func=local_main)
    for name in SUBCOMMANDS:
        add_subcommand(commands, name)
    return parser


def split_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """`trainhook render ... -- CMD ARGS`: (the arguments before `--`, the command after it)."""
    subcommand = next((word for word in argv if not word.startswith("-")), None)
    if "--" not in argv or subcommand not in COMMAND_TAKING:
        return argv, None
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1:]


def main(argv: list[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:2] in (["local", "scale"], ["local", "delete"]):  # before `trainhook local MANIFEST` takes the word
        from trainhook.local import scale_cli

        return (scale_cli.main if given[1] == "scale" else scale_cli.delete_main)(given[2:])
    own, command = split_command(given)
    args = build_parser().parse_args(own)
    if command is not None:
        if getattr(args, "command", None) not in COMMAND_TAKING:
            build_parser().error("only render and submit take a command after --")
        args.command_argv = command
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
