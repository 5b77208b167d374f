"""The self-managed TLS Secret deleted under two running webhook processes (real API server v1.20, the chart's RBAC):
no admission fails across the rebuild, because the rebuilt bundle keeps the CA the other replica still serves from
until it has moved; and the Secret (with its CA key) is owned by the webhook configuration, so the garbage
collector deletes it when `helm uninstall` deletes the configuration."""

from __future__ import annotations

import copy
import ssl
import threading
import time

import pytest
from cryptography import x509
from kubernetes import client
from kubernetes.client.rest import ApiException

import test_certs_selfmanaged as selfmanaged
from chart_render import find
from helpers import wait_for
from trainhook.certs import lifecycle
from trainhook.certs.build import CA_FILE, CERT_FILE
from webhook_process import free_port

pytestmark = pytest.mark.cluster
release = selfmanaged.release


def register_both(release, urls: list[str]) -> None:
    """The chart's configuration, its Services webhook once per replica (by URL): every labeled Service created in
    the namespace is reviewed by both replicas, so a replica the caBundle does not trust fails the create."""
    config = copy.deepcopy(find(release.manifests, "MutatingWebhookConfiguration"))
    [services] = [w for w in config["webhooks"] if w["name"].startswith("services.")]
    config["webhooks"] = []
    for letter, url in zip("ab", urls):
        hook = copy.deepcopy(services)
        hook.update(name=f"{letter}.{services['name']}", clientConfig={"url": f"{url}/mutate"},
                    namespaceSelector={"matchLabels": {"trainhook-test": release.fullname}})
        config["webhooks"].append(hook)
    with release.admin() as api:
        client.AdmissionregistrationV1Api(api).create_mutating_webhook_configuration(config)


def served_leaf(url: str) -> x509.Certificate:
    host, port = url.removeprefix("https://").rsplit(":", 1)
    return x509.load_pem_x509_certificate(ssl.get_server_certificate((host, int(port))).encode())


class Admissions(threading.Thread):
    """Creates labeled Services one after the other until stopped; every refusal is kept."""

    def __init__(self, release):
        super().__init__(daemon=True)
        self.release, self.stop, self.created, self.failures = release, threading.Event(), 0, []

    def run(self):
        with self.release.admin() as api:
            core = client.CoreV1Api(api)
            while not self.stop.is_set():
                name = f"s-{self.created + len(self.failures)}"
                try:
                    made = core.create_namespaced_service(self.release.namespace, {
                        "metadata": {"name": name, "labels": {"trainhook.dev/job-name": name}},
                        "spec": {"selector": {"trainhook.dev/job-name": name}, "ports": [{"port": 80}]}})
                    assert made.spec.cluster_ip == "None", "not mutated"
                    self.created += 1
                except (ApiException, AssertionError) as e:
                    self.failures.append(f"{time.strftime('%X')} {name}: {getattr(e, 'body', e)}")
                time.sleep(0.05)


def test_no_admission_fails_while_the_deleted_secret_is_rebuilt_under_two_replicas(release, tmp_path):
    urls = [f"https://{selfmanaged.HOST}:{free_port()}" for _ in range(2)]
    register_both(release, urls)
    # Replicas sync at different moments (jitter): one rebuilds, the other serves the old pair for seconds more.
    hooks = [selfmanaged.WebhookProcess(release, tmp_path / "a", urls[0], sync_interval=1),
             selfmanaged.WebhookProcess(release, tmp_path / "b", urls[1], sync_interval=4)]
    admissions = Admissions(release)
    try:
        for hook in hooks:
            wait_for("both replicas ready", lambda: hook.answers("/readyz", 200), timeout=60)
        old = release.secret_data()
        old_ca = lifecycle.pem_certificates(old[CA_FILE])[0]
        admissions.start()
        wait_for("admissions through both replicas", lambda: admissions.created >= 10, timeout=30)
        with release.admin() as api:
            client.CoreV1Api(api).delete_namespaced_secret(release.secret_name, release.namespace)

        def rebuilt_and_served():
            try:
                data = release.secret_data()
            except ApiException:
                return None
            leaf = lifecycle.pem_certificates(data[CERT_FILE])[0]
            if leaf.serial_number == lifecycle.pem_certificates(old[CERT_FILE])[0].serial_number:
                return None
            return data if all(served_leaf(url).serial_number == leaf.serial_number for url in urls) else None

        new = wait_for("the rebuilt Secret served by both replicas", rebuilt_and_served, timeout=60)
        created_at_move = admissions.created
        wait_for("admissions after the move", lambda: admissions.created >= created_at_move + 10, timeout=30)
        admissions.stop.set()
        admissions.join(30)
        assert admissions.failures == []
        # The rebuilt bundle: the new CA first, the old one kept (the caBundle holds both) until it is retired.
        new_cas = lifecycle.pem_certificates(new[CA_FILE])
        assert len(new_cas) == 2 and new_cas[1] == old_ca and new_cas[0] != old_ca
        assert release.ca_bundles() == [new[CA_FILE]] * 2
    finally:
        admissions.stop.set()
        for hook in hooks:
            if hook.process.poll() is None:
                hook.process.kill()
                hook.process.wait()


def test_the_secret_and_its_ca_key_go_with_the_webhook_configuration(release, tmp_path):
    release.register()
    manager = release.manager(tmp_path / "a")
    manager.sync()
    config_uid = release.config()["metadata"]["uid"]
    [owner] = release.secret()["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("MutatingWebhookConfiguration", release.config_name,
                                                            config_uid)
    assert manager.sync().wrote_secret is False  # settled: nothing written again
    # helm uninstall deletes the configuration: the garbage collector deletes the Secret, CA key included.
    with release.admin() as api:
        client.AdmissionregistrationV1Api(api).delete_mutating_webhook_configuration(release.config_name)

        def gone():
            try:
                client.CoreV1Api(api).read_namespaced_secret(release.secret_name, release.namespace)
            except ApiException as e:
                return e.status == 404
            return False
        wait_for("the garbage collector to delete the TLS Secret", gone, timeout=60)
