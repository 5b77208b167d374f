"""`trainhook local` plays the kubelet for the identity volume: the projected serviceAccountToken the webhook
injects is written as a random token per pod, and recorded with the pod it names for the local notary authority.
(The local authority and the runner's way to the notary are not built yet: see docs/security.md.)
"""

from __future__ import annotations

import hashlib
import json

import pytest

from trainhook import keys
from trainhook.local.envvars import EnvError, Sources
from trainhook.local.volumes import container_mounts, prepare_volumes


def gang_pod(name: str, uid: str) -> dict:
    return {"metadata": {"name": name, "namespace": "team-a", "uid": uid},
            "spec": {"serviceAccountName": "trainer", "volumes": [{"name": keys.IDENTITY_VOLUME, "projected": {
                "sources": [{"serviceAccountToken": {"audience": keys.IDENTITY_AUDIENCE, "expirationSeconds": 3600,
                                                     "path": "token"}}]}}],
                     "containers": [{"name": "trainer", "volumeMounts": [
                         {"name": keys.IDENTITY_VOLUME, "mountPath": keys.IDENTITY_DIR, "readOnly": True}]}]}}


def test_each_pod_gets_its_own_random_token_recorded_with_the_pod_it_names(tmp_path):
    tokens = {}
    for name, uid in (("ddp-0", "u0"), ("ddp-1", "u1")):
        pod = gang_pod(name, uid)
        volumes = prepare_volumes(pod, tmp_path / "pods" / name, tmp_path / "claims", Sources({}, {}))
        [mount] = container_mounts(pod["spec"]["containers"][0], volumes)
        assert mount.target == keys.IDENTITY_DIR and mount.read_only
        token = (volumes[keys.IDENTITY_VOLUME].path / "token").read_text()
        assert len(token) >= 32
        record = json.loads((tmp_path / "notary" / "tokens" / hashlib.sha256(token.encode()).hexdigest()).read_text())
        assert record == {"namespace": "team-a", "pod": name, "uid": uid, "serviceAccount": "trainer",
                          "audience": "trainhook"}
        tokens[name] = token
    assert tokens["ddp-0"] != tokens["ddp-1"]


def test_other_projected_sources_are_refused_naming_the_volume(tmp_path):
    pod = gang_pod("ddp-0", "u0")
    pod["spec"]["volumes"][0]["projected"]["sources"].append({"configMap": {"name": "x"}})
    with pytest.raises(EnvError, match="volume 'trainhook-identity': projected sources other than"):
        prepare_volumes(pod, tmp_path / "pods" / "ddp-0", tmp_path / "claims", Sources({}, {}))
