"""`trainhook`: the user's CLI. Each subcommand lives in its own module; this file only wires them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def certs_generate(args: argparse.Namespace) -> int:
    from trainhook.certs.build import write_bundle

    out = write_bundle(Path(args.out), args.san)
    print(f"wrote {out}/ca.crt, {out}/tls.crt, {out}/tls.key for {', '.join(args.san)}")
    return 0


def local_main(args: argparse.Namespace) -> int:
    from trainhook.local.cli import main

    return main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trainhook", description=(
        "Distributed training on plain Kubernetes workloads: label a StatefulSet or an Indexed Job and "
        "trainhook's webhook wires the gang."))
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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
