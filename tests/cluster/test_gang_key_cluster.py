"""The gang key on a real API server (v1.20): created once by the webhook, never by Helm, the same for every replica,
kept across restarts (an upgrade) and put back when its Secret vanishes; acting only as the chart's ServiceAccount
with only the chart's gang-key Role (the `release` fixture of test_certs_selfmanaged installs the chart's webhook
RBAC), so a permission the chart forgot fails here."""

from __future__ import annotations

import base64
import re
import threading

import pytest
from kubernetes import client

import test_certs_selfmanaged as selfmanaged
from chart_render import find, render_chart
from helpers import wait_for
from trainhook.webhook.notary import gang_key
from trainhook.webhook.notary.gang_key import GangKey, GangKeyError
from webhook_process import free_port

pytestmark = pytest.mark.cluster
release = selfmanaged.release  # the chart's ServiceAccount and webhook RBAC in a fresh namespace


def key_secret_name(release) -> str:
    return f"{release.fullname}-gang-key"


def stored_key(release) -> bytes:
    with release.admin() as api:
        secret = client.CoreV1Api(api).read_namespaced_secret(key_secret_name(release), release.namespace)
    return base64.b64decode(secret.data[gang_key.DATA_KEY])


def keeper(release, said: list[str] | None = None, **kwargs) -> GangKey:
    """A replica's keeper, authenticated as the chart's ServiceAccount (one API client per replica)."""
    core = client.CoreV1Api(release.cp.token_client(release.token))
    return GangKey(core, release.namespace, kwargs.pop("name", key_secret_name(release)),
                   say=(said if said is not None else []).append, **kwargs)


def test_the_chart_names_the_secret_the_webhook_keeps_and_grants_only_create_and_get_on_it(release):
    [container] = find(release.manifests, "Deployment")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TRAINHOOK_WEBHOOK_GANG_KEY_SECRET"] == key_secret_name(release)
    assert "TRAINHOOK_WEBHOOK_GANG_KEY" not in env  # the key itself is never in the pod spec
    assert not [m for m in release.manifests if m["kind"] == "Secret"]  # nor in the render


def test_replicas_creating_at_once_end_up_with_one_key(release):
    """Four replicas start together: all read 404, all create, three get 409 and read the winner's key."""
    barrier = threading.Barrier(4)
    keys: list[bytes] = []

    class InStep(GangKey):
        def _read(self):
            try:
                return super()._read()
            finally:
                try:
                    barrier.wait(timeout=5)
                except threading.BrokenBarrierError:
                    pass

    def replica():
        core = client.CoreV1Api(release.cp.token_client(release.token))
        keys.append(InStep(core, release.namespace, key_secret_name(release)).load())

    threads = [threading.Thread(target=replica) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(keys) == 4 and len(set(keys)) == 1 and len(keys[0]) == gang_key.NEW_KEY_BYTES
    assert keys[0] == stored_key(release)


def test_the_secret_is_the_truth_a_vanished_one_comes_back_with_the_key_held_and_a_changed_one_is_adopted(release):
    said: list[str] = []
    a, b = keeper(release, said), keeper(release, said)
    first = a.load()
    assert b.load() == first and not a.refresh()
    # Deleted (by hand, or by a tool that prunes what it did not render): put back with the key the replicas hold,
    # so gangs running on it keep working; both replicas racing to put it back agree.
    with release.admin() as api:
        client.CoreV1Api(api).delete_namespaced_secret(key_secret_name(release), release.namespace)
    assert not a.refresh() and not b.refresh()
    assert stored_key(release) == first == a.key == b.key
    # Changed there (rotated on purpose): every replica adopts it at its next look, and says so.
    new = b"n" * 40
    with release.admin() as api:
        client.CoreV1Api(api).patch_namespaced_secret(key_secret_name(release), release.namespace,
                                                      {"data": {"gang-key": base64.b64encode(new).decode()}})
    assert a.refresh() and b.refresh() and a.key == b.key == new
    assert any("changed" in line and gang_key.fingerprint(new) in line for line in said)


@pytest.mark.parametrize("stored, key", [
    (b"\n" + b"k" * 30 + b"\xff\t", b"\n" + b"k" * 30 + b"\xff\t"),  # random bytes: every byte is the key
    (b" " * 3 + b"\x00" * 32, b" " * 3 + b"\x00" * 32),
    (b"ab" * 32 + b"\n", b"ab" * 32),  # text (a file from `openssl rand -hex 32`): its last newline is not the key
], ids=["binary-edged-by-white-space-bytes", "binary-leading-spaces", "hex-text-with-newline"])
def test_a_binary_key_is_read_byte_for_byte_and_a_text_key_without_its_newline(release, stored, key):
    """The webhook's own keys are random bytes, and about one in twenty begins or ends with a byte that reads as
    white space (CI: a key read as 31 bytes and refused, so no replica served). Such a key is read whole."""
    with release.admin() as api:
        client.CoreV1Api(api).create_namespaced_secret(release.namespace, {
            "metadata": {"name": "edgy"}, "data": {"gang-key": base64.b64encode(stored).decode()}})
        reader = GangKey(client.CoreV1Api(api), release.namespace, "edgy", create=False)
        assert reader.load() == key


def test_an_existing_secret_is_only_read_and_a_missing_or_short_one_is_named_with_the_fix(control_plane,
                                                                                          k8s_namespace):
    """gangKey.existingSecret: the Role has no create, only get on that name."""
    manifests = render_chart({"fullnameOverride": "mine", "gangKey": {"existingSecret": "team-key"}}, k8s_namespace)
    role = find(manifests, "Role", "mine-gang-key")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["team-key"],
                              "verbs": ["get"]}]
    with control_plane.api_client() as api:
        core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
        core.create_namespaced_service_account(k8s_namespace, find(manifests, "ServiceAccount", "mine"))
        rbac.create_namespaced_role(k8s_namespace, role)
        rbac.create_namespaced_role_binding(k8s_namespace, find(manifests, "RoleBinding", "mine-gang-key"))
        token = selfmanaged.wait_for_service_account_token(api, k8s_namespace, "mine")
        reader = GangKey(client.CoreV1Api(control_plane.token_client(token)), k8s_namespace, "team-key", create=False)
        with pytest.raises(GangKeyError, match="team-key does not exist: create it"):
            reader.load()
        # With create=True it would try, and the chart's Role refuses: the message names the Role.
        creator = GangKey(client.CoreV1Api(control_plane.token_client(token)), k8s_namespace, "team-key")
        with pytest.raises(GangKeyError, match="403 forbidden.*gang-key grants"):
            creator.load()
        core.create_namespaced_secret(k8s_namespace, {"metadata": {"name": "team-key"},
                                                      "stringData": {"gang-key": "too-short"}})
        with pytest.raises(GangKeyError, match="9 bytes, fewer than 32"):
            reader.load()
        good = "f" * 64
        core.replace_namespaced_secret("team-key", k8s_namespace, {"metadata": {"name": "team-key"},
                                                                   "stringData": {"gang-key": good}})
        assert reader.load() == good.encode()
        # Another Secret in the namespace stays out of reach.
        other = GangKey(client.CoreV1Api(control_plane.token_client(token)), k8s_namespace, "someone-elses",
                        create=False)
        with pytest.raises(GangKeyError, match="403"):
            other.load()


def loaded_fingerprints(process) -> list[str]:
    return re.findall(r'"message": "gang key loaded".*?"fingerprint": "([0-9a-f]+)"', process.log_file.read_text())


def test_two_webhook_processes_serve_with_one_key_and_a_restart_keeps_it(release, tmp_path):
    """The chart's webhook, twice, started together with no Secret: both serve with the one key the Secret holds;
    both restarted (what an upgrade does): the same key again. Nothing about the key is in the render."""
    release.register()
    urls = [f"https://{selfmanaged.HOST}:{free_port()}" for _ in range(2)]
    hooks = [selfmanaged.WebhookProcess(release, tmp_path / name, url) for name, url in zip("ab", urls)]
    try:
        for hook in hooks:
            wait_for("the webhook to answer /healthz", lambda: hook.answers("/healthz", 200), timeout=60)
        key = stored_key(release)
        assert [loaded_fingerprints(h) for h in hooks] == [[gang_key.fingerprint(key)]] * 2
        for hook in hooks:
            assert hook.stop() == 0
        again = [selfmanaged.WebhookProcess(release, tmp_path / f"{name}2", url) for name, url in zip("ab", urls)]
        hooks += again
        for hook in again:
            wait_for("the restarted webhook to answer /healthz", lambda: hook.answers("/healthz", 200), timeout=60)
        assert [loaded_fingerprints(h) for h in again] == [[gang_key.fingerprint(key)]] * 2
        assert stored_key(release) == key
        for line in (tmp_path / "a" / "webhook.log").read_text().splitlines():
            assert key.hex() not in line and base64.b64encode(key).decode() not in line
    finally:
        for hook in hooks:
            if hook.process.poll() is None:
                hook.process.kill()
                hook.process.wait()
