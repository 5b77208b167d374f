"""Self-managed certificates against the real control plane (tests/support/cluster_api.py): the Secret, the caBundle,
two replicas, and the webhook process itself, with nothing but the chart's RBAC.

Every test installs the chart's own ServiceAccount, Role, ClusterRole, bindings and MutatingWebhookConfiguration
(rendered by the real Helm, `fullnameOverride` unique per test) and acts as that ServiceAccount, so a permission
the chart forgot fails here. The webhook configuration is the chart's, with two changes the test cluster needs:
the API server reaches the webhook by URL (no kubelet, no Service routing), and only the test's namespace is
selected.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import json
import os
import subprocess
import sys
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from chart_render import find, render_chart
from cluster_api import cluster, wait_for_service_account_token
from trainhook.certs import lifecycle
from trainhook.certs.build import CA_FILE, CERT_FILE, KEY_FILE, build_ca
from trainhook.webhook import selfcerts
from trainhook.webhook.selfcerts import Conflict, SelfManagedCerts, service_hostnames
from webhook_process import free_port
from helpers import wait_for

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
STRANGER_CA = build_ca("not-ours", dt.datetime.now(dt.timezone.utc)).cert_pem




@dataclass
class Release:
    """The chart's webhook objects, installed in the test namespace as release `fullname`."""

    cp: object
    namespace: str
    fullname: str
    manifests: list[dict]
    token: str
    url: str

    @property
    def secret_name(self) -> str:
        return f"{self.fullname}-tls"

    @property
    def config_name(self) -> str:
        return self.fullname

    def hostnames(self) -> list[str]:
        return [*service_hostnames(self.fullname, self.namespace, "cluster.local"), HOST]

    def manager(self, cert_dir: Path, clock=selfcerts.utc_now) -> SelfManagedCerts:
        """A replica's manager, authenticated as the chart's ServiceAccount (one API client per replica)."""
        return SelfManagedCerts(self.cp.token_client(self.token), namespace=self.namespace,
                                secret_name=self.secret_name, webhook_config_name=self.config_name,
                                hostnames=self.hostnames(), cert_dir=cert_dir, clock=clock,
                                identity=f"replica-{cert_dir.name}")

    def admin(self):
        return self.cp.api_client()

    def register(self) -> None:
        """Create the chart's MutatingWebhookConfiguration (no caBundle: the chart leaves it to the webhook)."""
        config = copy.deepcopy(find(self.manifests, "MutatingWebhookConfiguration"))
        for webhook in config["webhooks"]:
            assert "caBundle" not in webhook["clientConfig"]
            webhook["clientConfig"] = {"url": f"{self.url}/mutate"}
            webhook["namespaceSelector"] = {"matchLabels": {"trainhook-test": self.fullname}}
        with self.admin() as api:
            client.AdmissionregistrationV1Api(api).create_mutating_webhook_configuration(config)

    def config(self) -> dict:
        with self.admin() as api:
            return json.loads(client.AdmissionregistrationV1Api(api).read_mutating_webhook_configuration(
                self.config_name, _preload_content=False).data)

    def ca_bundles(self) -> list[bytes | None]:
        return [base64.b64decode(w["clientConfig"]["caBundle"]) if w["clientConfig"].get("caBundle") else None
                for w in self.config()["webhooks"]]

    def overwrite_ca_bundles(self, pem: bytes) -> None:
        patch = [{"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": base64.b64encode(pem).decode()}
                 for i in range(len(self.config()["webhooks"]))]
        with self.admin() as api:
            client.AdmissionregistrationV1Api(api).patch_mutating_webhook_configuration(self.config_name, patch)

    def secret(self) -> dict:
        with self.admin() as api:
            return json.loads(client.CoreV1Api(api).read_namespaced_secret(
                self.secret_name, self.namespace, _preload_content=False).data)

    def secret_data(self) -> dict[str, bytes]:
        return {k: base64.b64decode(v) for k, v in self.secret()["data"].items()}


WEBHOOK_RBAC = ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")


@pytest.fixture
def release(control_plane, k8s_namespace):
    fullname = f"th-{uuid.uuid4().hex[:8]}"
    manifests = render_chart({"fullnameOverride": fullname}, k8s_namespace)
    ours = [m for m in manifests if m["kind"] in WEBHOOK_RBAC
            and m["metadata"]["labels"]["app.kubernetes.io/component"] == "webhook"]
    # one of each for the certificates, the gang key's Role and binding (its one Secret), and the scale check's
    # ClusterRole and binding (reading StatefulSets)
    names = {(m["kind"], m["metadata"]["name"]) for m in ours}
    assert {("Role", f"{fullname}-certs"), ("RoleBinding", f"{fullname}-certs"), ("Role", f"{fullname}-gang-key"),
            ("ClusterRole", f"{fullname}-webhook-config"), ("ServiceAccount", fullname)} <= names
    port = free_port()
    with control_plane.api_client() as api:
        core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
        core.patch_namespace(k8s_namespace, {"metadata": {"labels": {"trainhook-test": fullname}}})
        create = {"ServiceAccount": lambda m: core.create_namespaced_service_account(k8s_namespace, m),
                  "Role": lambda m: rbac.create_namespaced_role(k8s_namespace, m),
                  "RoleBinding": lambda m: rbac.create_namespaced_role_binding(k8s_namespace, m),
                  "ClusterRole": rbac.create_cluster_role,
                  "ClusterRoleBinding": rbac.create_cluster_role_binding}
        for manifest in ours:
            create[manifest["kind"]](manifest)
        account = find(manifests, "ServiceAccount", fullname)["metadata"]["name"]
        token = wait_for_service_account_token(api, k8s_namespace, account)
        try:
            yield Release(control_plane, k8s_namespace, fullname, manifests, token, f"https://{HOST}:{port}")
        finally:
            admission = client.AdmissionregistrationV1Api(api)
            for delete, name in [(admission.delete_mutating_webhook_configuration, fullname),
                                 (rbac.delete_cluster_role_binding, f"{fullname}-webhook-config"),
                                 (rbac.delete_cluster_role, f"{fullname}-webhook-config"),
                                 (rbac.delete_cluster_role_binding, f"{fullname}-statefulsets"),
                                 (rbac.delete_cluster_role, f"{fullname}-statefulsets")]:
                try:
                    delete(name)
                except ApiException as e:
                    if e.status != 404:
                        raise


def served_files(cert_dir: Path) -> dict[str, bytes]:
    return {name: (cert_dir / name).read_bytes() for name in (CA_FILE, CERT_FILE, KEY_FILE)}


def leaf_of(data: dict[str, bytes]):
    return lifecycle.pem_certificates(data[CERT_FILE])[0]


# --- one replica -------------------------------------------------------------------------------------------------

def test_self_managed_creates_the_secret_and_writes_the_ca_bundle_with_only_the_charts_rbac(release, tmp_path):
    release.register()
    manager = release.manager(tmp_path / "a")
    assert manager.not_ready_reason(None) == "no serving certificate loaded yet"

    report = manager.sync()
    assert report.action is lifecycle.Action.CREATE and report.wrote_secret and report.patched_ca_bundle

    secret = release.secret()
    assert secret["type"] == "kubernetes.io/tls"
    assert secret["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "trainhook-webhook"
    assert secret["metadata"]["annotations"][selfcerts.ACTION_ANNOTATION].startswith("create: ")
    assert secret["metadata"]["annotations"][selfcerts.WRITER_ANNOTATION] == "replica-a"
    data = release.secret_data()
    assert set(data) == {"ca.crt", "ca.key", "tls.crt", "tls.key"}
    # Every webhook of the chart's configuration (workloads, services, scale) now trusts the Secret's CA, and
    # nothing else.
    assert release.ca_bundles() == [data[CA_FILE]] * 3
    # The pair served is the Secret's, for the Service's names.
    assert served_files(tmp_path / "a") == {k: data[k] for k in (CA_FILE, CERT_FILE, KEY_FILE)}
    assert oct((tmp_path / "a" / KEY_FILE).stat().st_mode & 0o777) == "0o600"
    assert lifecycle.sans(leaf_of(data)) == frozenset(release.hostnames())
    assert manager.not_ready_reason(leaf_of(data)) is None

    again = manager.sync()
    assert (again.action, again.wrote_secret, again.patched_ca_bundle) == (lifecycle.Action.KEEP, False, False)
    assert release.secret()["metadata"]["resourceVersion"] == secret["metadata"]["resourceVersion"]


def test_without_the_webhook_configuration_the_pair_is_served_but_not_ready(release, tmp_path):
    manager = release.manager(tmp_path / "a")
    with pytest.raises(LookupError, match="does not exist"):
        manager.sync()
    data = release.secret_data()  # the Secret is settled and the files written all the same
    assert served_files(tmp_path / "a")[CERT_FILE] == data[CERT_FILE]
    assert "was not read yet" in manager.not_ready_reason(leaf_of(data))

    release.register()
    assert manager.sync().patched_ca_bundle
    assert manager.not_ready_reason(leaf_of(data)) is None


def test_the_ca_bundle_is_put_back_after_being_overwritten(release, tmp_path):
    release.register()
    manager = release.manager(tmp_path / "a")
    manager.sync()
    ca = release.secret_data()[CA_FILE]
    serving = leaf_of(release.secret_data())

    release.overwrite_ca_bundles(STRANGER_CA)
    assert release.ca_bundles() == [STRANGER_CA] * 3
    report = manager.sync()
    assert report.action is lifecycle.Action.KEEP and report.patched_ca_bundle
    assert release.ca_bundles() == [ca] * 3
    assert manager.not_ready_reason(serving) is None

    # One webhook emptied, the other one carrying ours and a stranger: both put back exactly.
    with release.admin() as api:
        client.AdmissionregistrationV1Api(api).patch_mutating_webhook_configuration(release.config_name, [
            {"op": "remove", "path": "/webhooks/0/clientConfig/caBundle"},
            {"op": "add", "path": "/webhooks/1/clientConfig/caBundle",
             "value": base64.b64encode(ca + STRANGER_CA).decode()}])
    assert manager.sync().patched_ca_bundle
    assert release.ca_bundles() == [ca] * 3


def test_a_corrupted_secret_is_recreated_and_the_ca_bundle_follows(release, tmp_path):
    release.register()
    manager = release.manager(tmp_path / "a")
    manager.sync()
    before = release.secret()
    before["data"]["ca.key"] = base64.b64encode(b"-----BEGIN PRIVATE KEY-----\nbroken\n").decode()
    with release.admin() as api:
        client.CoreV1Api(api).replace_namespaced_secret(release.secret_name, release.namespace, before)

    report = manager.sync()
    assert report.action is lifecycle.Action.CREATE and "the CA is unusable" in report.reason
    data = release.secret_data()
    assert release.ca_bundles() == [data[CA_FILE]] * 3
    assert served_files(tmp_path / "a")[CERT_FILE] == data[CERT_FILE]


# --- two replicas ------------------------------------------------------------------------------------------------

def sync_together(managers: list[SelfManagedCerts]) -> list[selfcerts.SyncReport]:
    """Every manager's sync() at once (threads released by one barrier)."""
    barrier = threading.Barrier(len(managers))
    reports: list = [None] * len(managers)
    errors: list = []

    def one(i: int) -> None:
        barrier.wait()
        try:
            reports[i] = managers[i].sync()
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(managers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    if errors:
        raise errors[0]
    return reports


def test_two_replicas_starting_together_agree_on_one_secret(release, tmp_path):
    release.register()
    replicas = [release.manager(tmp_path / "a"), release.manager(tmp_path / "b")]
    reports = sync_together(replicas)
    # One created the Secret; the other lost the race (or read it after) and took it as it is.
    assert sorted(r.action.value for r in reports) == ["create", "keep"]
    assert [r.wrote_secret for r in reports].count(True) == 1
    data = release.secret_data()
    assert served_files(tmp_path / "a") == served_files(tmp_path / "b") == {
        k: data[k] for k in (CA_FILE, CERT_FILE, KEY_FILE)}
    assert release.ca_bundles() == [data[CA_FILE]] * 3


def test_two_replicas_due_for_rotation_rotate_once(release, tmp_path):
    release.register()
    release.manager(tmp_path / "first").sync()
    created = release.secret_data()
    in_300_days = lambda: selfcerts.utc_now() + dt.timedelta(days=300)  # under a third of a year left
    replicas = [release.manager(tmp_path / "a", clock=in_300_days), release.manager(tmp_path / "b", clock=in_300_days)]
    reports = sync_together(replicas)
    assert [r.wrote_secret for r in reports].count(True) == 1
    assert {r.action for r in reports} == {lifecycle.Action.ROTATE_SERVING, lifecycle.Action.KEEP}
    rotated = release.secret_data()
    assert leaf_of(rotated).serial_number != leaf_of(created).serial_number
    assert rotated[CA_FILE] == created[CA_FILE]  # same CA: the caBundle did not have to change
    assert not any(r.patched_ca_bundle for r in reports)
    assert served_files(tmp_path / "a") == served_files(tmp_path / "b")
    assert served_files(tmp_path / "a")[CERT_FILE] == rotated[CERT_FILE]


def test_a_write_based_on_a_stale_read_is_refused_and_the_next_sync_takes_the_winner(release, tmp_path):
    release.register()
    a, b = release.manager(tmp_path / "a"), release.manager(tmp_path / "b")
    a.sync()
    stale = release.secret()
    later = lambda: selfcerts.utc_now() + dt.timedelta(days=300)
    b.clock = later
    assert b.sync().action is lifecycle.Action.ROTATE_SERVING  # b wins
    decision = lifecycle.decide({k: base64.b64decode(v) for k, v in stale["data"].items()}, a.hostnames, later())
    with pytest.raises(Conflict):
        a._write_secret(stale, decision)  # a's update carries the resourceVersion it read before b wrote
    with pytest.raises(Conflict):
        a._write_secret(None, decision)  # and a create of a Secret that exists loses too
    a.clock = later
    assert a.sync().action is lifecycle.Action.KEEP
    assert served_files(tmp_path / "a") == served_files(tmp_path / "b")


# --- the webhook process ------------------------------------------------------------------------------------------

class WebhookProcess:
    """`trainhook-webhook` started with the chart's own args and environment (plus what a pod would get from the
    downward API), authenticated as the chart's ServiceAccount through a kubeconfig holding its token."""

    def __init__(self, release: Release, workdir: Path, url: str | None = None, sync_interval: float = 1):
        deployment = find(release.manifests, "Deployment")
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        workdir.mkdir(parents=True, exist_ok=True)
        kubeconfig = workdir / "kubeconfig"
        kubeconfig.write_text(json.dumps(cluster.kubeconfig_dict(release.cp.host, release.cp.ca_pem,
                                                                 "webhook", token=release.token)))
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("TRAINHOOK_WEBHOOK_") and k != "KUBERNETES_SERVICE_HOST"}
        env.update({e["name"]: e["value"] for e in container["env"] if "value" in e})
        env.update(TRAINHOOK_WEBHOOK_NAMESPACE=release.namespace, TRAINHOOK_WEBHOOK_POD_NAME="webhook-0",
                   KUBECONFIG=str(kubeconfig))
        if "TRAINHOOK_WEBHOOK_NOTARY_PORT" in env:  # the notary's listener: a free port, not the chart's 8444
            env["TRAINHOOK_WEBHOOK_NOTARY_PORT"] = str(free_port())
        self.url, self.release = url or release.url, release
        port = self.url.rsplit(":", 1)[1]
        command = [os.path.join(os.path.dirname(sys.executable), container["command"][0]), *container["args"],
                   "--host", HOST, "--port", port, "--cert-dir", str(workdir / "certs"), "--extra-sans", HOST,
                   "--cert-sync-interval", str(sync_interval), "--tls-reload-interval", "0.2"]

        self.log_file = workdir / "webhook.log"
        self.ca_file = workdir / "ca.crt"
        self.process = subprocess.Popen(command, env=env, stdout=self.log_file.open("wb"), stderr=subprocess.STDOUT)

    def get(self, path: str) -> requests.Response:
        self.ca_file.write_bytes(self.release.secret_data()[CA_FILE])
        return requests.get(self.url + path, verify=str(self.ca_file), timeout=5)

    def answers(self, path: str, status: int) -> bool:
        assert self.process.poll() is None, self.log_file.read_text()
        try:
            return self.get(path).status_code == status
        except (requests.RequestException, ApiException):
            return False

    def stop(self) -> int:
        self.process.terminate()
        return self.process.wait(20)


def apply_example(api, namespace: str) -> None:
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    for doc in yaml.safe_load_all((REPO / "examples" / "pytorch" / "ddp.yaml").read_text()):
        {"Service": core.create_namespaced_service, "ConfigMap": core.create_namespaced_config_map,
         "StatefulSet": apps.create_namespaced_stateful_set}[doc["kind"]](namespace, doc)


def test_the_webhook_process_keeps_its_ca_bundle_and_pods_are_mutated_through_it(release, tmp_path):
    hook = WebhookProcess(release, tmp_path)
    try:
        # Serving (liveness) as soon as the Secret is settled; not ready while no configuration trusts it.
        wait_for("the webhook to answer /healthz", lambda: hook.answers("/healthz", 200))
        not_ready = hook.get("/readyz")
        assert not_ready.status_code == 503 and release.config_name in not_ready.text

        release.register()
        wait_for("/readyz once the caBundle is written", lambda: hook.answers("/readyz", 200))
        ca = release.secret_data()[CA_FILE]
        assert release.ca_bundles() == [ca] * 3
        assert release.secret()["metadata"]["annotations"][selfcerts.WRITER_ANNOTATION] == "webhook-0"

        # The API server calls the webhook, trusting it through the caBundle the webhook wrote itself.
        with release.admin() as api:
            apply_example(api, release.namespace)
            core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
            assert apps.read_namespaced_stateful_set("ddp", release.namespace).spec.pod_management_policy == "Parallel"
            service = core.read_namespaced_service("ddp", release.namespace)
            assert service.spec.publish_not_ready_addresses is True
            pods = wait_for("the StatefulSet's 4 pods", lambda: (
                lambda items: items if len(items) == 4 else None)(
                core.list_namespaced_pod(release.namespace, label_selector="app=ddp").items))
            for pod in pods:
                env = {e.name: e.value for e in pod.spec.containers[0].env}
                assert env["PET_NNODES"] == "4" and env["MASTER_PORT"] == "23456", pod.metadata.name
                assert env["MASTER_ADDR"] == "ddp-0.ddp"
                assert [c.name for c in pod.spec.init_containers][:1] == ["trainhook-gang-wait"]

        # Something overwrites the caBundle: the webhook puts it back within its sync interval.
        release.overwrite_ca_bundles(STRANGER_CA)
        wait_for("the caBundle to be put back", lambda: release.ca_bundles() == [ca] * 3, timeout=20)
        wait_for("/readyz after the caBundle is back", lambda: hook.answers("/readyz", 200))
        with release.admin() as api:
            # Admission works again through the restored caBundle.
            created = client.CoreV1Api(api).create_namespaced_service(release.namespace, {
                "metadata": {"name": "again", "labels": {"trainhook.dev/job-name": "again"}},
                "spec": {"selector": {"trainhook.dev/job-name": "again"}, "ports": [{"port": 80}]}})
            assert created.spec.cluster_ip == "None" and created.spec.publish_not_ready_addresses is True
        log = hook.log_file.read_text()
        assert '"restored": true' in log
        assert hook.stop() == 0
    finally:
        if hook.process.poll() is None:
            hook.process.kill()
            hook.process.wait()
