"""The real Kubernetes v1.20 control plane (hack/cluster.py), for tests: the helpers around it.

The fixtures are tests/cluster/conftest.py's: `control_plane` (session) and `k8s_namespace` (function), for the
tests of that room, the only ones that need the control plane. Here:

`cluster`: hack/cluster.py, loaded once per process (bench/notary.py loads it through here too).

`wait_for_service_account_token(api_client, namespace, name)`: the token the controller-manager minted.

`register_webhook(api_client, ca_pem, url)` registers the trainhook MutatingWebhookConfiguration;
`unregister_webhook(api_client)` removes it.
"""

from __future__ import annotations

import base64
import importlib.util
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WEBHOOK_CONFIGURATION_NAME = "trainhook"
NOTARY_GANG_KEY = b"notary-test-gang-key-0123456789abcdef"  # the key of tests/cluster/conftest.py's `notary`


def _load_cluster_module():
    name = "trainhook_hack_cluster"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "hack" / "cluster.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while the class is built
        spec.loader.exec_module(module)
    return sys.modules[name]


cluster = _load_cluster_module()


def wait_for_service_account_token(api_client, namespace: str, name: str, timeout: float = 30) -> str:
    """The token the controller-manager minted for a ServiceAccount (1.20 still keeps it in a Secret)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException
    core = client.CoreV1Api(api_client)
    deadline = time.monotonic() + timeout
    while True:
        try:
            sa = core.read_namespaced_service_account(name, namespace)
            for ref in sa.secrets or []:
                secret = core.read_namespaced_secret(ref.name, namespace)
                if secret.type == "kubernetes.io/service-account-token" and (secret.data or {}).get("token"):
                    return base64.b64decode(secret.data["token"]).decode()
        except ApiException as e:
            if e.status != 404:
                raise
        if time.monotonic() > deadline:
            raise TimeoutError(f"no token for ServiceAccount {namespace}/{name} after {timeout}s")
        time.sleep(0.2)


def webhook_configuration(ca_pem: bytes, url: str, timeout_seconds: int = 10) -> dict:
    """The trainhook MutatingWebhookConfiguration (admissionregistration.k8s.io/v1) for a webhook at `url`
    (`https://HOST:PORT/mutate`), trusting `ca_pem`: the chart's two fail-closed webhooks (without its scale
    check), registered for exactly the operations the webhook mutates (mutate.MUTATED_OPERATIONS: pods at
    CREATE only, as the chart does, so a pod's updates never depend on the webhook being up) or refuses
    (mutate.REFUSED_OPERATIONS: the kinds that never make a gang)."""
    from trainhook.webhook.admission.mutate import MUTATED_OPERATIONS, REFUSED_OPERATIONS

    def rule(group: str, resource: str, kind: str) -> dict:
        return {"apiGroups": [group], "apiVersions": ["v1"], "resources": [resource],
                "operations": list(MUTATED_OPERATIONS[kind])}

    common = {
        "clientConfig": {"url": url, "caBundle": base64.b64encode(ca_pem).decode()},
        "failurePolicy": "Fail",
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": timeout_seconds,
    }
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": WEBHOOK_CONFIGURATION_NAME},
        "webhooks": [
            {
                "name": "workloads.trainhook.dev",
                "objectSelector": {"matchExpressions": [{"key": "trainhook.dev/framework", "operator": "Exists"}]},
                "rules": [rule("", "pods", "Pod"), rule("apps", "statefulsets", "StatefulSet"),
                          rule("batch", "jobs", "Job"),
                          *[{"apiGroups": [group], "apiVersions": ["v1"], "resources": [resource],
                             "operations": list(REFUSED_OPERATIONS[kind])}
                            for group, resource, kind in (("apps", "deployments", "Deployment"),
                                                          ("apps", "replicasets", "ReplicaSet"),
                                                          ("apps", "daemonsets", "DaemonSet"),
                                                          ("", "replicationcontrollers", "ReplicationController"))]],
                **common,
            },
            {
                "name": "services.trainhook.dev",
                "objectSelector": {"matchExpressions": [{"key": "trainhook.dev/job-name", "operator": "Exists"}]},
                "rules": [rule("", "services", "Service")],
                **common,
            },
        ],
    }


def register_webhook(api_client, ca_pem: bytes, url: str, timeout_seconds: int = 10):
    """Create (or replace) the `trainhook` MutatingWebhookConfiguration. The API server picks a new
    configuration up through an informer, usually within a second: a test that needs it in force should
    retry its first labeled create until it is mutated, or wait briefly."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException
    api = client.AdmissionregistrationV1Api(api_client)
    body = webhook_configuration(ca_pem, url, timeout_seconds)
    try:
        return api.create_mutating_webhook_configuration(body)
    except ApiException as e:
        if e.status != 409:
            raise
    current = api.read_mutating_webhook_configuration(WEBHOOK_CONFIGURATION_NAME)
    body["metadata"]["resourceVersion"] = current.metadata.resource_version
    return api.replace_mutating_webhook_configuration(WEBHOOK_CONFIGURATION_NAME, body)


def unregister_webhook(api_client) -> None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException
    try:
        client.AdmissionregistrationV1Api(api_client).delete_mutating_webhook_configuration(
            WEBHOOK_CONFIGURATION_NAME)
    except ApiException as e:
        if e.status != 404:
            raise


def start_notary(control_plane, workdir: Path, *extra_args: str):
    """The webhook's console script as the chart's Deployment runs it with the notary: `--notary-authority
    cluster`, the gang key NOTARY_GANG_KEY, its notary on a free port (`.notary_url` set on the returned process)."""
    from webhook_process import free_port, start_webhook

    key_file = workdir / "gang.key"
    key_file.write_bytes(NOTARY_GANG_KEY)
    port = free_port()
    hook = start_webhook(workdir, env=control_plane.env(), extra_args=[
        "--notary-authority", "cluster", "--notary-port", str(port), "--notary-url", f"https://127.0.0.1:{port}",
        "--gang-key-file", str(key_file), *extra_args])
    hook.notary_url = f"https://127.0.0.1:{port}"
    return hook

