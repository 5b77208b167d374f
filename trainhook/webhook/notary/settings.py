"""The notary's settings: its flags, the URL gang pods dial and the CA that verifies it, and which authority answers
(docs/operate/security.md), read by server.py and background.py; kept apart so that webhook/notary/service.py is only
the order of the notary's I/O and its HTTP mapping.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from trainhook.webhook.settings import Settings

if TYPE_CHECKING:
    from trainhook.webhook.notary.authority import Authority

DEFAULT_PORT = 8444


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("notary", "the gang members' notary (docs/operate/security.md): their signing "
                                      "key, and the outcome recorded on their behalf")
    group.add_argument("--notary-authority", default=os.environ.get("TRAINHOOK_WEBHOOK_NOTARY_AUTHORITY", "none"),
                       help="none (no notary), cluster (TokenReview and the API server, in-cluster or "
                            "KUBECONFIG) or local:RUN_DIR (a trainhook local run's files) "
                            "(env TRAINHOOK_WEBHOOK_NOTARY_AUTHORITY)")
    group.add_argument("--notary-port", type=int, default=int(os.environ.get("TRAINHOOK_WEBHOOK_NOTARY_PORT",
                                                                             DEFAULT_PORT)),
                       help=f"the notary's HTTPS port (env TRAINHOOK_WEBHOOK_NOTARY_PORT; default {DEFAULT_PORT})")
    group.add_argument("--notary-url", default=os.environ.get("TRAINHOOK_WEBHOOK_NOTARY_URL", ""),
                       help="the notary's base URL as gang pods dial it, injected as TRAINHOOK_NOTARY "
                            "(env TRAINHOOK_WEBHOOK_NOTARY_URL; the chart sets "
                            "https://<service>.<namespace>.svc:<port>)")
    group.add_argument("--notary-tokens", default=os.environ.get("TRAINHOOK_WEBHOOK_NOTARY_TOKENS", "auto"),
                       choices=("auto", "review"),
                       help="how the cluster authority verifies a member's token: auto (against the keys the API "
                            "server publishes at /openid/v1/jwks where it serves them, else a TokenReview at a "
                            "bounded rate) or review (a TokenReview always) (env TRAINHOOK_WEBHOOK_NOTARY_TOKENS)")
    group.add_argument("--notary-namespaces", default=os.environ.get("TRAINHOOK_WEBHOOK_NOTARY_NAMESPACES", ""),
                       help="comma-separated namespaces where gangs run (the chart's rbac.gangNamespaces), where the "
                            "sweep looks for gangs whose coordinator is gone (webhook/notary/sweep.py); empty: every "
                            "namespace (env TRAINHOOK_WEBHOOK_NOTARY_NAMESPACES)")
    group.add_argument("--notary-sweep-interval", type=float,
                       default=float(os.environ.get("TRAINHOOK_WEBHOOK_NOTARY_SWEEP_INTERVAL", "30")),
                       help="seconds between the sweep's looks for finished gang Jobs nobody recorded; 0: no sweep "
                            "(env TRAINHOOK_WEBHOOK_NOTARY_SWEEP_INTERVAL; default 30)")
    group.add_argument("--notary-ca-file", default=os.environ.get("TRAINHOOK_WEBHOOK_NOTARY_CA_FILE", ""),
                       help="PEM CA bundle gang pods verify the notary with (env TRAINHOOK_WEBHOOK_NOTARY_CA_FILE, "
                            "or the PEM itself in TRAINHOOK_WEBHOOK_NOTARY_CA; default: the certificate mode's "
                            "ca.crt)")


def check_arguments(args: argparse.Namespace) -> str | None:
    """Why the notary flags cannot work, or None."""
    authority = args.notary_authority
    if authority.startswith("local:"):  # trainhook local's run directory (webhook/notary/local.py)
        if not Path(authority[len("local:"):]).is_dir():
            return (f"--notary-authority {authority!r}: local:DIR names the directory of a trainhook local run, "
                    "and there is no such directory")
    elif authority not in ("none", "cluster"):
        return f"--notary-authority {authority!r}: use none, cluster or local:DIR"
    if not 0 <= getattr(args, "notary_sweep_interval", 0) <= 3600:
        return f"--notary-sweep-interval {args.notary_sweep_interval:g}: use seconds from 0 (no sweep) to 3600"
    if not 0 < args.notary_port < 65536:
        return f"--notary-port {args.notary_port}: use a TCP port from 1 to 65535"
    return None


class FileText:
    """A small text file read again only when it changes (a stat per call: cheap enough for every admission,
    and no API call); "" while it does not exist."""

    def __init__(self, path: Path):
        self.path, self.text = path, ""
        self.seen: tuple[int, int] | None = None  # (mtime in ns, size) of the text read

    def __call__(self) -> str:
        try:
            stat = self.path.stat()
            if (stat.st_mtime_ns, stat.st_size) != self.seen:
                self.text, self.seen = self.path.read_text(), (stat.st_mtime_ns, stat.st_size)
        except OSError:
            self.text, self.seen = "", None
        return self.text


def notary_settings(settings: Settings, args: argparse.Namespace) -> Settings:
    """`settings` with the notary's URL and CA: the CA file named, else the PEM in the environment (certificate
    mode `secret`: the chart's caBundle), else the mode's own ca.crt (self-managed: the one its cert dir keeps from
    the Secret; cert-manager: the mounted Secret's, beside tls.crt)."""
    if args.notary_authority == "none":
        return settings
    ca: Callable[[], str] | str  # the PEM, or a file to read it from (Settings.notary_ca)
    if args.notary_ca_file:
        ca = FileText(Path(args.notary_ca_file))
    elif os.environ.get("TRAINHOOK_WEBHOOK_NOTARY_CA"):
        ca = os.environ["TRAINHOOK_WEBHOOK_NOTARY_CA"]
    elif args.certs.mode == "self-managed":
        ca = FileText(Path(args.certs.cert_dir) / "ca.crt")
    else:
        ca = FileText(Path(args.certs.cert_file or ".").with_name("ca.crt"))
    return replace(settings, notary_url=args.notary_url, notary_ca=ca)


def authority_from(args: argparse.Namespace, api_client=None) -> Authority:
    if args.notary_authority.startswith("local:"):
        from trainhook.webhook.notary.local import LocalAuthority
        return LocalAuthority(Path(args.notary_authority[len("local:"):]))
    from trainhook.webhook.notary.cluster import ClusterAuthority
    from trainhook.webhook.selfcerts import kube_client
    return ClusterAuthority(api_client or kube_client(), local_tokens=getattr(args, "notary_tokens", "auto") == "auto")
