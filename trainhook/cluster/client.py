"""The cluster side of `trainhook submit/status/logs/delete` and of the SDK: a thin I/O edge.

Everything here is a Kubernetes API call and nothing else; what the answers mean (ranks, outcome, tables) is
decided by the pure functions of trainhook.cluster.status, on plain dicts. A gang is every object labeled
`trainhook.dev/job-name=<name>`. Configuration: an explicit kubeconfig, else $KUBECONFIG or ~/.kube/config,
else the pod's in-cluster service account.

A server that cannot be reached, or refuses the credentials or the call, is one ClusterUnreachable or ClusterDenied
naming it and the fix (trainhook.cluster.reach), never urllib3's chain of errors; the client is built with bounded
retries and timeouts, so that is said at once.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainhook.gang import keys
from trainhook.cluster import reach
# The errors live in trainhook.cluster.errors; callers import them from here too.
from trainhook.cluster.errors import ClusterDenied, ClusterError, ClusterUnreachable, api_error, reaching  # noqa: F401
from trainhook.gang.lookup import LABELS, setting

IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# (apiVersion, kind) -> plural, for every kind a gang is made of. Core kinds go through CoreV1Api.
PLURALS = {
    ("v1", "Service"): "services", ("v1", "Pod"): "pods", ("v1", "ConfigMap"): "configmaps",
    ("v1", "Secret"): "secrets", ("apps/v1", "StatefulSet"): "statefulsets", ("batch/v1", "Job"): "jobs",
    ("scheduling.volcano.sh/v1beta1", "PodGroup"): "podgroups",
    ("scheduling.x-k8s.io/v1alpha1", "PodGroup"): "podgroups",
}
# What `delete` removes, in this order (workloads first, so their controllers stop recreating pods).
GANG_KINDS = [("apps/v1", "StatefulSet"), ("batch/v1", "Job"), ("v1", "Pod"), ("v1", "Service"),
              ("scheduling.volcano.sh/v1beta1", "PodGroup"), ("scheduling.x-k8s.io/v1alpha1", "PodGroup")]


def load_api_client(kubeconfig: str | None = None, context: str | None = None):
    """A kubernetes ApiClient from a kubeconfig (the flag, $KUBECONFIG, ~/.kube/config) or in-cluster."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    kubeconfig = kubeconfig or os.environ.get("KUBECONFIG")  # read now: the client reads it once, at import
    default = Path(os.path.expanduser("~/.kube/config"))
    configuration = client.Configuration()
    if kubeconfig or default.exists():
        try:
            config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=configuration,
                                    persist_config=False)
        except (ConfigException, OSError) as e:
            raise ClusterError(f"cannot load kubeconfig {kubeconfig or default}: {e}") from e
    else:
        try:
            config.load_incluster_config(client_configuration=configuration)
        except ConfigException as e:
            raise ClusterError("no kubeconfig (--kubeconfig, $KUBECONFIG, ~/.kube/config) and not in a pod: "
                               f"{e}") from e
    return client.ApiClient(configuration)


def origin_of(kubeconfig: str | None = None, context: str | None = None) -> str:
    """Where the server's address came from, as a failure names it: `kubeconfig PATH, context NAME`."""
    from kubernetes import config

    kubeconfig = kubeconfig or os.environ.get("KUBECONFIG")
    default = Path(os.path.expanduser("~/.kube/config"))
    if not kubeconfig and not default.exists():
        return "in-cluster service account"
    if not context:
        try:
            context = config.list_kube_config_contexts(config_file=kubeconfig)[1].get("name")
        except Exception:  # noqa: BLE001 - only a name for a message; loading the kubeconfig reports its errors
            context = None
    return f"kubeconfig {kubeconfig or default}" + (f", context {context}" if context else "")


def default_namespace(kubeconfig: str | None = None, context: str | None = None) -> str:
    """The current context's namespace, the pod's own in-cluster, else `default` (as kubectl decides)."""
    from kubernetes import config
    from kubernetes.config.config_exception import ConfigException

    try:
        contexts, active = config.list_kube_config_contexts(config_file=kubeconfig or os.environ.get("KUBECONFIG"))
    except (ConfigException, OSError, TypeError, ValueError):
        if IN_CLUSTER_NAMESPACE.exists():
            return IN_CLUSTER_NAMESPACE.read_text().strip() or "default"
        return "default"
    chosen = next((c for c in contexts if c.get("name") == context), active) if context else active
    return ((chosen or {}).get("context") or {}).get("namespace") or "default"


def workload_job_name(obj: dict) -> str:
    """A workload's gang name: its job-name label, written on the workload or on its pod template (either place
    works, as in admission; the template's first, as its pods carry it: trainhook/gang/lookup.py), else the
    workload's own name."""
    return setting(obj, keys.JOB_NAME, LABELS) or (obj.get("metadata") or {}).get("name", "")


def snake(kind: str) -> str:
    """ConfigMap -> config_map: how the typed core API names its calls."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", kind).lower()


def split_api_version(api_version: str) -> tuple[str, str]:
    group, _, version = api_version.rpartition("/")
    return group, version


@dataclass
class GangObjects:
    """Everything labeled with one gang's name, as plain dicts."""

    workloads: list[dict] = field(default_factory=list)  # StatefulSets and Jobs
    pods: list[dict] = field(default_factory=list)


class Cluster:
    """Calls on one cluster; objects go in and come out as plain dicts."""

    def __init__(self, api_client, namespace: str = "default", origin: str = ""):
        """`origin` says where the server's address came from (`kubeconfig PATH, context NAME`), for messages.
        The client's connections get trainhook's retries (reach.bound), wherever it was built (the SDK's
        client_configuration too)."""
        from kubernetes import client

        reach.bound(api_client)
        self.api_client = api_client
        self.namespace = namespace
        self.origin = origin
        self.server = api_client.configuration.host
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)

    @classmethod
    def connect(cls, kubeconfig: str | None = None, context: str | None = None,
                namespace: str | None = None) -> "Cluster":
        return cls(load_api_client(kubeconfig, context), namespace or default_namespace(kubeconfig, context),
                   origin_of(kubeconfig, context))

    def close(self) -> None:
        self.api_client.close()

    def _reaching(self):
        return reaching(self.server, self.origin)

    def _raw(self, method, *args, streaming: bool = False, **kwargs):
        """One API call with the bounded timeouts, its answer unread; failures as errors.reaching says."""
        with self._reaching():
            return method(*args, _preload_content=False, _request_timeout=reach.request_timeout(streaming),
                          **kwargs)

    def _call(self, method, *args, **kwargs) -> dict:
        """One API call's answer as JSON: read without the typed models, which do not know every server's answers
        (a 1.20 API server answers a Service deletion with a Status, not the Service)."""
        response = self._raw(method, *args, **kwargs)
        try:
            with self._reaching():
                return json.loads(response.data or b"{}")
        finally:
            response.release_conn()

    def _plural(self, obj: dict) -> str:
        key = (obj.get("apiVersion", ""), obj.get("kind", ""))
        return PLURALS.get(key) or f"{key[1].lower()}s"

    # --- create, list, delete -----------------------------------------------------------------------------
    def create(self, obj: dict) -> dict:
        """Create one namespaced object (its own namespace, else the client's); returns it as stored."""
        from kubernetes.client.exceptions import ApiException

        namespace = obj.get("metadata", {}).get("namespace") or self.namespace
        group, version = split_api_version(obj["apiVersion"])
        plural = self._plural(obj)
        try:
            if not group:
                creator = getattr(self.core, f"create_namespaced_{snake(obj['kind'])}", None)
                if creator is None:
                    raise ClusterError(f"{obj['kind'].lower()}/{obj['metadata'].get('name')}: not a namespaced "
                                       "core kind; create it with kubectl")
                return self._call(creator, namespace, obj)
            return self._call(self.custom.create_namespaced_custom_object, group, version, namespace,
                                         plural, obj)
        except ApiException as e:
            raise api_error(e, f"{obj['kind'].lower()}/{obj['metadata'].get('name')}") from e

    def list_objects(self, api_version: str, kind: str, selector: str, namespace: str | None = None,
                     everywhere: bool = False) -> list[dict]:
        """Objects of one kind matching a label selector (in every namespace with `everywhere`); a kind the
        cluster does not serve lists nothing."""
        from kubernetes.client.exceptions import ApiException

        namespace = namespace or self.namespace
        group, version = split_api_version(api_version)
        plural = PLURALS[(api_version, kind)]
        try:
            if everywhere:
                answer = (self._call(getattr(self.core, f"list_{snake(kind)}_for_all_namespaces"),
                                     label_selector=selector) if not group else
                          self._call(self.custom.list_cluster_custom_object, group, version, plural,
                                     label_selector=selector))
            elif not group:
                lister = getattr(self.core, f"list_namespaced_{snake(kind)}")
                answer = self._call(lister, namespace, label_selector=selector)
            else:
                answer = self._call(self.custom.list_namespaced_custom_object, group, version,
                                               namespace, plural, label_selector=selector)
            items = answer.get("items") or []
        except ApiException as e:
            if e.status == 404 and group:  # the CRD is not installed: nothing of that kind
                return []
            raise api_error(e) from e
        for item in items:  # lists leave out each item's apiVersion and kind
            item.setdefault("apiVersion", api_version)
            item.setdefault("kind", kind)
        return items

    def delete(self, obj: dict) -> None:
        from kubernetes.client import V1DeleteOptions
        from kubernetes.client.exceptions import ApiException

        meta = obj["metadata"]
        namespace = meta.get("namespace") or self.namespace
        group, version = split_api_version(obj["apiVersion"])
        background = V1DeleteOptions(propagation_policy="Background")  # a Job's pods go with it, as kubectl does
        try:
            if not group:
                deleter = getattr(self.core, f"delete_namespaced_{snake(obj['kind'])}")
                self._call(deleter, meta["name"], namespace, body=background)
            else:
                self._call(self.custom.delete_namespaced_custom_object, group, version, namespace,
                                      self._plural(obj), meta["name"], body=background)
        except ApiException as e:
            if e.status != 404:
                raise api_error(e, f"{obj['kind'].lower()}/{meta['name']}") from e

    # --- gangs --------------------------------------------------------------------------------------------
    def workloads(self) -> list[dict]:
        """The namespace's labeled StatefulSets and Jobs (the framework label is on the workload itself)."""
        return (self.list_objects("apps/v1", "StatefulSet", keys.FRAMEWORK)
                + self.list_objects("batch/v1", "Job", keys.FRAMEWORK))

    def gang(self, name: str) -> GangObjects:
        workloads = [w for w in self.workloads() if workload_job_name(w) == name]
        return GangObjects(workloads, self.list_objects("v1", "Pod", f"{keys.JOB_NAME}={name}"))

    def gangs(self) -> dict[str, GangObjects]:
        """Every gang of the namespace, by name (the workloads' job name, the pods' job-name label)."""
        found: dict[str, GangObjects] = {}
        for workload in self.workloads():
            found.setdefault(workload_job_name(workload), GangObjects()).workloads.append(workload)
        for pod in self.list_objects("v1", "Pod", keys.JOB_NAME):
            found.setdefault(pod["metadata"]["labels"][keys.JOB_NAME], GangObjects()).pods.append(pod)
        return dict(sorted(found.items()))

    def gangs_where(self, selector: str = "", everywhere: bool = False) -> dict[tuple[str, str], GangObjects]:
        """`trainhook list`'s gangs by (namespace, name): of this namespace, or of all (`everywhere`); with a label
        `selector`, those with a workload that matches it (a bare-Pod gang: a pod that matches it)."""
        extra = f",{selector}" if selector else ""
        found: dict[tuple[str, str], GangObjects] = {}
        for api_version, kind in (("apps/v1", "StatefulSet"), ("batch/v1", "Job")):
            for workload in self.list_objects(api_version, kind, keys.FRAMEWORK + extra, everywhere=everywhere):
                key = (workload["metadata"].get("namespace") or self.namespace, workload_job_name(workload))
                found.setdefault(key, GangObjects()).workloads.append(workload)
        matching = ({(p["metadata"].get("namespace") or self.namespace, p["metadata"]["labels"][keys.JOB_NAME])
                     for p in self.list_objects("v1", "Pod", keys.JOB_NAME + extra, everywhere=everywhere)
                     if not p["metadata"].get("ownerReferences")}
                    if selector else None)
        for pod in self.list_objects("v1", "Pod", keys.JOB_NAME, everywhere=everywhere):
            key = (pod["metadata"].get("namespace") or self.namespace, pod["metadata"]["labels"][keys.JOB_NAME])
            if key in found or matching is None or key in matching:
                found.setdefault(key, GangObjects()).pods.append(pod)
        return dict(sorted(found.items()))

    def delete_gang(self, name: str) -> list[str]:
        """Delete every object of the gang; returns `kind/name` of each deleted one, in order."""
        deleted = []
        selector = f"{keys.JOB_NAME}={name}"
        for api_version, kind in GANG_KINDS:
            if kind in ("StatefulSet", "Job"):
                found = [w for w in self.list_objects(api_version, kind, keys.FRAMEWORK)
                         if workload_job_name(w) == name]
            else:
                found = self.list_objects(api_version, kind, selector)
            for obj in found:
                if kind == "Pod" and obj["metadata"].get("ownerReferences"):
                    continue  # its workload's deletion takes it
                self.delete(obj)
                deleted.append(f"{kind.lower()}/{obj['metadata']['name']}")
        return deleted

    def read_pod(self, name: str) -> dict | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return self._call(self.core.read_namespaced_pod, name, self.namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise api_error(e, f"pod/{name}") from e

    def log_lines(self, pod: str, container: str, follow: bool = False, tail: int | None = None) -> Iterator[str]:
        """A container's log, line by line (following it while the container runs, with `follow`)."""
        from kubernetes.client.exceptions import ApiException

        kwargs: dict = {"container": container, "follow": follow}
        if tail is not None:
            kwargs["tail_lines"] = tail
        try:
            response: Any = self._raw(self.core.read_namespaced_pod_log, pod, self.namespace, streaming=follow,
                                       **kwargs)
        except ApiException as e:
            raise api_error(e, f"pod/{pod}") from e
        pending = b""
        try:
            with self._reaching():  # the connection may break while the log streams
                for chunk in response.stream(4096, decode_content=True):
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        yield line.decode("utf-8", "replace")
            if pending:
                yield pending.decode("utf-8", "replace")
        finally:
            response.release_conn()


def gang_state_of(cluster: Cluster, name: str):
    """The gang's state, read from the cluster now."""
    from trainhook.cluster.status import gang_state

    objects = cluster.gang(name)
    return gang_state(name, cluster.namespace, objects.workloads, objects.pods)


def wait_for_gang(cluster: Cluster, name: str, timeout: float | None = None, interval: float = 2.0,
                  report=None):
    """Poll the gang until it succeeds or fails; `report(lines)` gets what changed at each look. Raises
    TimeoutError (with the last state as its second argument) when `timeout` seconds pass first."""
    import time

    from trainhook.cluster.status import changes

    deadline = None if timeout is None else time.monotonic() + timeout
    before = None
    while True:
        state = gang_state_of(cluster, name)
        if report is not None:
            lines = changes(before, state)
            if lines:
                report(lines)
        if state.finished:
            return state
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"gang {name} still {state.outcome} after {timeout:g}s", state)
        before = state
        time.sleep(interval if deadline is None else max(0.0, min(interval, deadline - time.monotonic())))
