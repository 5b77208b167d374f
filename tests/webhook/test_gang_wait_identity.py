"""The tcp gang wait proves its hellos with the gang's key (issue 31 item 5), so its init container gets what the
training container has to ask the notary for it: the pod's token mount and the notary's URL and CA. The dns wait
sends no hello and gets neither (an init container holds no more than it needs)."""

from __future__ import annotations

import pytest

from trainhook.gang import keys
from trainhook.webhook.admission.mutate import mutate
from trainhook.webhook.settings import Settings
from objects import pod_of_statefulset, statefulset

SETTINGS = Settings(notary_url="https://trainhook.trainhook.svc:8443", notary_ca="-----BEGIN CERTIFICATE-----\nx\n")


def init_container(mode: str) -> dict:
    sts = mutate("StatefulSet", "CREATE", statefulset("ddp", 2, annotations={keys.GANG_WAIT: mode}), "team-a",
                 SETTINGS).obj
    pod = mutate("Pod", "CREATE", pod_of_statefulset(sts, 1), "team-a", SETTINGS).obj
    [wait] = [c for c in pod["spec"]["initContainers"] if c["name"] == keys.GANG_WAIT_CONTAINER]
    return wait


def test_the_tcp_wait_gets_the_token_and_the_notary():
    wait = init_container("tcp")
    env = {e["name"]: e["value"] for e in wait["env"]}
    assert env[keys.TH_NOTARY] == SETTINGS.notary_url and env[keys.TH_NOTARY_CA] == SETTINGS.notary_ca
    assert {"name": keys.IDENTITY_VOLUME, "mountPath": keys.IDENTITY_DIR, "readOnly": True} in wait["volumeMounts"]


@pytest.mark.parametrize("mode", ["dns"])
def test_the_dns_wait_gets_neither(mode):
    wait = init_container(mode)
    assert keys.TH_NOTARY not in {e["name"] for e in wait["env"]}
    assert all(m["name"] != keys.IDENTITY_VOLUME for m in wait.get("volumeMounts", []))
