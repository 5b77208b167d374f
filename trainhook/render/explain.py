"""`trainhook explain MANIFEST`: what the webhook would do to every pod of a manifest, offline.

The webhook's own code (`mutate`, called directly, no server) admits the Services and workloads; the
StatefulSet/Job controllers are emulated (trainhook.local.controllers) to make the pods they would create, and
each pod is admitted in turn, as on a cluster. For every pod: its name and the environment injected into its
training container (`NAME=VALUE` lines), or with `-o yaml` the mutated pods. A refusal is printed as kubectl
prints the webhook's message, and the exit status is 1. A Deployment, ReplicaSet, DaemonSet or
ReplicationController labeled for training is refused by name (trainhook.render.kinds), not left out.
"""

from __future__ import annotations

import argparse
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from trainhook.gang import keys
from trainhook.local.controllers import ControllerError, pod_requests, store
from trainhook.local.manifest import ManifestError, describe, parse_manifest
from trainhook.render.kinds import check_kinds
from trainhook.webhook.admission.member import Denied
from trainhook.webhook.admission.mutate import is_opted_in, mutate
from trainhook.webhook.settings import Settings, settings_from_env

# The webhook configurations' names (charts/trainhook/templates/mutatingwebhookconfiguration.yaml), which
# kubectl prints in a refusal.
WORKLOADS_WEBHOOK = "workloads.trainhook.dev"
SERVICES_WEBHOOK = "services.trainhook.dev"
# Kinds a trainhook manifest may carry that explain has nothing to say about (the schedulers' objects).
QUIET_KINDS = ("PodGroup",)


class Refused(Exception):
    """The webhook would deny an object; the message is the one kubectl prints."""


@dataclass
class ExplainedPod:
    pod: dict  # the mutated pod, as the apiserver would store it
    injected: list[tuple[str, str]]  # the training container's variables the webhook added, in order
    container: str


@dataclass
class Explained:
    pods: list[ExplainedPod] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)


def refusal(obj: dict, denied: Denied, source: str, created_by: str = "") -> Refused:
    webhook = SERVICES_WEBHOOK if obj.get("kind") == "Service" else WORKLOADS_WEBHOOK
    message = f'admission webhook "{webhook}" denied the request: trainhook: ' + "; ".join(denied.problems)
    if created_by:  # a controller's pod creation: on a cluster the refusal is an event on the workload
        return Refused(f"{created_by} could not create {pod_name(obj)}: {message}")
    return Refused(f'Error from server (Forbidden): error when creating "{source}": {message}')


def pod_name(pod: dict) -> str:
    meta = pod.get("metadata") or {}
    return meta.get("name") or f"{meta.get('generateName', '')}*"


def admit(obj: dict, settings: Settings, warnings: list[str], source: str, created_by: str = "") -> dict:
    namespace = obj["metadata"].get("namespace") or "default"
    try:
        mutation = mutate(obj["kind"], "CREATE", obj, namespace, settings)
    except Denied as denied:
        raise refusal(obj, denied, source, created_by) from denied
    warnings.extend(f"{describe(obj)}: {message}" for message in mutation.warnings)
    return mutation.obj


def training_container(pod: dict) -> dict:
    containers = pod["spec"].get("containers") or [{}]
    wanted = (pod["metadata"].get("annotations") or {}).get(keys.CONTAINER)
    return next((c for c in containers if c.get("name") == wanted), containers[0])


def env_value(item: dict) -> str:
    if "value" in item:
        return str(item["value"])
    source = item.get("valueFrom") or {}
    field_ref = source.get("fieldRef") or {}
    if field_ref:
        return f"(from {field_ref.get('fieldPath')})"
    return f"(from {', '.join(source) or 'nothing'})"


def injected_env(before: dict, after: dict) -> tuple[str, list[tuple[str, str]]]:
    """The variables the webhook added to the training container (the user's own are not listed)."""
    container = training_container(after)
    original: dict = next((c for c in before["spec"].get("containers") or []
                           if c.get("name") == container.get("name")), {})
    own = {item.get("name") for item in original.get("env") or []}
    return container.get("name", ""), [(item["name"], env_value(item)) for item in container.get("env") or []
                                       if item.get("name") not in own]


def explain_text(text: str, source: str = "<manifest>", namespace: str | None = None,
                 settings: Settings | None = None) -> Explained:
    """Explain a manifest's text (raises ManifestError, ControllerError or Refused)."""
    check_kinds(text, source)
    return explain_manifest(parse_manifest(text, source, namespace), settings)


def read_manifest(source: str) -> tuple[str, str]:
    """(the text, the name to report it by) of a manifest file, or of standard input for `-`."""
    if source == "-":
        return sys.stdin.read(), "<stdin>"
    try:
        return Path(source).read_text(encoding="utf-8"), source
    except OSError as e:
        raise ManifestError(f"cannot read {source}: {e.strerror or e}") from e


def explain_manifest(manifest, settings: Settings | None = None) -> Explained:
    settings = settings or Settings()
    result = Explained(ignored=[item for item in manifest.ignored if item.split("/")[0] not in QUIET_KINDS])
    rng = random.Random(0)  # stable uids and names, so the output is reproducible
    for svc in manifest.services:
        admit(svc, settings, result.warnings, manifest.path)
    stored = []
    for workload in manifest.workloads:
        if not is_opted_in(workload["kind"], workload):  # the webhook would never see it nor its pods
            result.ignored.append(f"{workload['kind']}/{workload['metadata'].get('name') or '?'} "
                                  f"({workload['apiVersion']}; not labeled {keys.FRAMEWORK})")
            continue
        stored.append(store(admit(workload, settings, result.warnings, manifest.path), rng))
    for workload in stored:
        requests = pod_requests(workload)
        if not requests:  # a bare Pod, admitted above as the user created it
            before = next(w for w in manifest.workloads if w["metadata"].get("name") == workload["metadata"]["name"])
            name, env = injected_env(before, workload)
            result.pods.append(ExplainedPod(workload, env, name))
        for request in requests:
            pod = admit(request.pod, settings, result.warnings, manifest.path, describe(workload))
            name, env = injected_env(request.pod, pod)
            result.pods.append(ExplainedPod(pod, env, name))
    return result


def env_text(explained: Explained) -> str:
    """`# pod NAME (container C)` and then its injected `NAME=VALUE` lines, a blank line between pods."""
    blocks = []
    for item in explained.pods:
        lines = [f"# pod {pod_name(item.pod)} (container {item.container})"]
        lines += [f"{name}={value}" for name, value in item.injected]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + ("\n" if blocks else "")


def pods_yaml(explained: Explained) -> str:
    return yaml.safe_dump_all([item.pod for item in explained.pods], sort_keys=False, default_flow_style=False)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Show, offline, what trainhook's webhook injects into every pod a manifest's "
                          "workloads would create (the webhook's own code, no cluster).")
    parser.add_argument("manifest", help="a YAML manifest ('-': standard input)")
    parser.add_argument("-o", "--output", choices=("env", "yaml"), default="env",
                        help="env: each pod's injected NAME=VALUE lines (default); yaml: the mutated pods")
    parser.add_argument("-n", "--namespace", help="the namespace of objects that name none (default: default)")
    parser.add_argument("--launcher-image", help="the gang-wait init container's image (the chart's value)")
    parser.add_argument("--cluster-domain", help="the cluster's DNS domain (default cluster.local)")


def settings_from_args(args: argparse.Namespace) -> Settings:
    found = settings_from_env()
    if args.launcher_image:
        found["launcher_image"] = args.launcher_image
    if args.cluster_domain:
        found["cluster_domain"] = args.cluster_domain
    return Settings(**found)


def main(args: argparse.Namespace) -> int:
    try:
        text, source = read_manifest(args.manifest)
        explained = explain_text(text, source, args.namespace, settings_from_args(args))
    except Refused as e:
        print(str(e), file=sys.stderr)
        return 1
    except (ManifestError, ControllerError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for message in explained.warnings:
        print(f"Warning: {message}", file=sys.stderr)
    kubeflow = [item for item in explained.ignored if "kubeflow.org/" in item]
    if kubeflow:  # what a Kubeflow user tries first; trainhook's webhook never sees a Kubeflow job
        source = "FILE" if args.manifest == "-" else args.manifest
        print(f"error: {', '.join(item.split(' (')[0] for item in kubeflow)}: a Kubeflow job, which trainhook's "
              f"webhook never sees (it wires StatefulSets, Jobs and Pods); convert it first: trainhook convert "
              f"{source} | trainhook explain -", file=sys.stderr)
        return 1
    if explained.ignored:
        print(f"Warning: not explained (no pods of trainhook's): {', '.join(explained.ignored)}", file=sys.stderr)
    if not explained.pods:  # an empty answer would read as "the webhook injects nothing"
        print(f"error: {args.manifest}: no StatefulSet, Job or Pod labeled {keys.FRAMEWORK}: the webhook would "
              f"wire nothing; label the workloads and their pod templates (docs/use/contract.md section 1)",
              file=sys.stderr)
        return 1
    sys.stdout.write(pods_yaml(explained) if args.output == "yaml" else env_text(explained))
    return 0
