"""Read and record a gang's outcome on its workload with the launcher's standard-library client (kube_api), and
scale a StatefulSet gang to zero: what the launcher did itself before issue 22, kept here as the tests' recorder.

The launcher no longer calls this (the pods hold no Kubernetes permission; the coordinator records through the
notary, launcher/notary_client.py, docs/operate/security.md), so it left launcher/ and the zip every pod gets. The
cluster tests that need a recorded outcome write it with this, in the launcher's own format
(tests/support/launcher_outcomes.py, tests/cluster/test_kube_api_cluster.py); the calls need `get`/`patch` on
statefulsets (and `patch` on statefulsets/scale, jobs), which the chart grants no training pod."""

from __future__ import annotations

from trainhook.launcher.mpi import kube_api
from trainhook.launcher.outcome import Outcome

KINDS = ("StatefulSet", "Job")
PATHS = {"StatefulSet": "/apis/apps/v1/namespaces/{namespace}/statefulsets/{name}",
         "Job": "/apis/batch/v1/namespaces/{namespace}/jobs/{name}"}
FORBIDDEN_HINT = (": this needs get/patch on the gang's workloads, which the chart grants no training pod (the "
                  "notary records outcomes: docs/operate/security.md)")


class Unavailable(Exception):
    """The API cannot be used from here (not in a pod with a ServiceAccount token), or refused the call; the
    message says which and why, in the API server's words."""


def client(service_account_dir: str) -> kube_api.Client:
    """A client authenticated as the pod's ServiceAccount: the token and CA the kubelet mounts at
    `service_account_dir`, the API server at $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT."""
    try:
        return kube_api.in_cluster(service_account_dir)
    except kube_api.KubeError as e:
        raise Unavailable(str(e)) from e


def _call(what: str, function, *args: object) -> dict:
    try:
        return function(*args)
    except kube_api.ApiError as e:
        raise Unavailable(f"cannot {what}: {e}{FORBIDDEN_HINT if e.status == 403 else ''}") from e
    except kube_api.KubeError as e:
        raise Unavailable(f"cannot {what}: {e}") from e


def _path(kind: str, name: str, namespace: str) -> str:
    if kind not in PATHS:
        raise Unavailable(f"a {kind or 'bare Pod'} gang has no workload to record its outcome on")
    return PATHS[kind].format(namespace=namespace, name=name)


def read_outcome(api: kube_api.Client, kind: str, name: str, namespace: str) -> Outcome | None:
    """The outcome recorded on the workload, or None when it carries none."""
    obj = _call(f"get {kind}/{name}", api.get, _path(kind, name, namespace))
    return Outcome.from_annotations((obj.get("metadata") or {}).get("annotations") or {})


def record_outcome(api: kube_api.Client, kind: str, name: str, namespace: str, outcome: Outcome) -> None:
    """Write the outcome's annotations on the workload (a metadata-only merge patch: the pod template is
    untouched, so nothing rolls)."""
    _call(f"record the outcome on {kind}/{name}", api.merge_patch, _path(kind, name, namespace),
          {"metadata": {"annotations": outcome.annotations()}})


def scale_to_zero(api: kube_api.Client, name: str, namespace: str) -> None:
    """Scale a StatefulSet to zero through its scale subresource; its controller then deletes the pods."""
    _call(f"scale StatefulSet/{name} to zero", api.merge_patch, _path("StatefulSet", name, namespace) + "/scale",
          {"spec": {"replicas": 0}})
