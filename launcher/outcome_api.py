"""The launcher's only Kubernetes API calls: read and record the gang's outcome on its workload, and scale a
StatefulSet gang to zero once it is done (so no pod reruns finished training and no GPU stays held).

Thin on purpose: every decision is made elsewhere (gang_run); this module turns one into API calls with the
pod's own ServiceAccount (in-cluster configuration) and turns every refusal into one line that says why. What
the calls need is the chart's training ClusterRole: `get`/`patch` on statefulsets and `patch` on
statefulsets/scale (and `get`/`patch` on jobs to record a Job gang's outcome).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from trainhook.launcher.lifecycle import Outcome

REQUEST_TIMEOUT = 10.0
KINDS = ("StatefulSet", "Job")


class Unavailable(Exception):
    """The API cannot be used from here (not in a pod with a ServiceAccount token), or refused the call; the
    message says which and why, in the API server's words."""


def client(service_account_dir: str) -> Any:
    """An ApiClient authenticated as the pod's ServiceAccount: the token and CA the kubelet mounts at
    `service_account_dir`, the API server at $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT."""
    if not os.environ.get("KUBERNETES_SERVICE_HOST"):
        raise Unavailable("not in a Kubernetes pod (no KUBERNETES_SERVICE_HOST)")
    from kubernetes import client as k8s
    from kubernetes.config import ConfigException
    from kubernetes.config.incluster_config import InClusterConfigLoader
    directory = Path(service_account_dir)
    configuration = k8s.Configuration()
    try:
        InClusterConfigLoader(token_filename=str(directory / "token"), cert_filename=str(directory / "ca.crt"),
                              try_refresh_token=True).load_and_set(configuration)
    except ConfigException as e:
        raise Unavailable(f"no usable ServiceAccount credentials in {directory} ({e}); is "
                          f"automountServiceAccountToken off?") from e
    return k8s.ApiClient(configuration)


def api_error(error: Any) -> str:
    """The API server's own message from an ApiException (its Status), e.g. `statefulsets.apps "x" is
    forbidden: User "system:serviceaccount:ns:sa" cannot patch resource ...`."""
    body = getattr(error, "body", None) or ""
    try:
        status = json.loads(body)
        if isinstance(status, dict) and status.get("message"):
            return f"{status['message']} (HTTP {status.get('code', getattr(error, 'status', '?'))})"
    except ValueError:
        pass
    return f"{getattr(error, 'reason', '') or error} (HTTP {getattr(error, 'status', '?')})"


def _call(what: str, function: Any, *args: Any) -> Any:
    from kubernetes.client.rest import ApiException
    from urllib3.exceptions import HTTPError
    try:
        return function(*args, _request_timeout=REQUEST_TIMEOUT)
    except ApiException as e:
        hint = (": bind the pod's ServiceAccount to the chart's training ClusterRole (values "
                "trainingServiceAccounts)" if e.status == 403 else "")
        raise Unavailable(f"cannot {what}: {api_error(e)}{hint}") from e
    except (HTTPError, OSError) as e:
        raise Unavailable(f"cannot {what}: the API server is not reachable ({e})") from e


def _apis(api: Any, kind: str) -> tuple[Any, str]:
    from kubernetes import client as k8s
    if kind == "StatefulSet":
        return k8s.AppsV1Api(api), "stateful_set"
    if kind == "Job":
        return k8s.BatchV1Api(api), "job"
    raise Unavailable(f"a {kind or 'bare Pod'} gang has no workload to record its outcome on")


def read_outcome(api: Any, kind: str, name: str, namespace: str) -> Outcome | None:
    """The outcome recorded on the workload, or None when it carries none."""
    group, noun = _apis(api, kind)
    obj = _call(f"get {kind}/{name}", getattr(group, f"read_namespaced_{noun}"), name, namespace)
    return Outcome.from_annotations(obj.metadata.annotations or {})


def record_outcome(api: Any, kind: str, name: str, namespace: str, outcome: Outcome) -> None:
    """Write the outcome's annotations on the workload (a metadata-only patch: the pod template is untouched,
    so nothing rolls)."""
    group, noun = _apis(api, kind)
    _call(f"record the outcome on {kind}/{name}", getattr(group, f"patch_namespaced_{noun}"), name, namespace,
          {"metadata": {"annotations": outcome.annotations()}})


def scale_to_zero(api: Any, name: str, namespace: str) -> None:
    """Scale a StatefulSet to zero through its scale subresource; its controller then deletes the pods."""
    group, _ = _apis(api, "StatefulSet")
    _call(f"scale StatefulSet/{name} to zero", group.patch_namespaced_stateful_set_scale, name, namespace,
          {"spec": {"replicas": 0}})
