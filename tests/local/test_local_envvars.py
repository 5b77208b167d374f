"""trainhook local: container environments and commands as the kubelet builds them."""

from __future__ import annotations

import base64
import os
import sys

import pytest

from trainhook.local.envvars import (EnvError, PodFacts, Sources, base_env, command_line, container_env, expand,
                                     mapping_for)

CONTEXT = {"A": "x", "EMPTY": ""}


@pytest.mark.parametrize(("text", "expected"), [
    ("$(A)", "x"),
    ("pre-$(A)-post", "pre-x-post"),
    ("$(MISSING)", "$(MISSING)"),
    ("$$(A)", "$(A)"),
    ("$$$(A)", "$x"),
    ("$(EMPTY)!", "!"),
    ("$(A", "$(A"),
    ("$A", "$A"),
    ("cost $5", "cost $5"),
    ("trailing $", "trailing $"),
    ("$()", "$()"),
    ("$(A)$(A)", "xx"),
])
def test_expansion_follows_kubernetes(text, expected):
    assert expand(text, mapping_for(CONTEXT)) == expected


POD = {"metadata": {"name": "ddp-1", "namespace": "ml", "uid": "u-9", "labels": {"app": "t"},
                    "annotations": {"note": "hi"}},
       "spec": {"containers": []}}
FACTS = PodFacts(pod_ip="10.244.3.3")
CONFIGMAP = {"metadata": {"name": "cfg"}, "data": {"LR": "0.1", "MODE": "fast"}}
SECRET = {"metadata": {"name": "sec"}, "data": {"TOKEN": base64.b64encode(b"s3cret").decode()}}
SOURCES = Sources({("ml", "cfg"): CONFIGMAP}, {("ml", "sec"): SECRET})


def env_of(*items, env_from=()):
    return container_env({"name": "c", "env": list(items), "envFrom": list(env_from)}, POD, FACTS, SOURCES)


def test_references_see_only_earlier_variables():
    env = env_of({"name": "LATE_REF", "value": "$(B)"}, {"name": "B", "value": "b"},
                 {"name": "C", "value": "$(B)-$(HOME)"})
    assert env == {"LATE_REF": "$(B)", "B": "b", "C": "b-$(HOME)"}


def test_field_refs_read_the_pod():
    def ref(path):
        return {"valueFrom": {"fieldRef": {"fieldPath": path}}}
    env = env_of({"name": "N", **ref("metadata.name")}, {"name": "NS", **ref("metadata.namespace")},
                 {"name": "IP", **ref("status.podIP")}, {"name": "NODE", **ref("spec.nodeName")},
                 {"name": "L", **ref("metadata.labels['app']")}, {"name": "AN", **ref("metadata.annotations['note']")},
                 {"name": "U", **ref("metadata.uid")}, {"name": "GREETING", "value": "$(N)@$(IP)"})
    assert env == {"N": "ddp-1", "NS": "ml", "IP": "10.244.3.3", "NODE": "local", "L": "t", "AN": "hi",
                   "U": "u-9", "GREETING": "ddp-1@10.244.3.3"}


def test_an_unsupported_field_ref_is_an_error():
    with pytest.raises(EnvError, match="status.hostIP"):
        env_of({"name": "H", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}})


def test_config_map_and_secret_refs():
    env = env_of({"name": "RATE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "LR"}}},
                 {"name": "T", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "TOKEN"}}},
                 {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "nope", "key": "x", "optional": True}}},
                 env_from=[{"configMapRef": {"name": "cfg"}, "prefix": "CFG_"}])
    assert env == {"CFG_LR": "0.1", "CFG_MODE": "fast", "RATE": "0.1", "T": "s3cret"}


def test_a_missing_config_map_is_an_error():
    with pytest.raises(EnvError, match='configmap "nope" not found'):
        env_of({"name": "X", "valueFrom": {"configMapKeyRef": {"name": "nope", "key": "x"}}})


def test_command_and_args_expand_with_the_container_env():
    container = {"name": "c", "command": ["sh", "-c"], "args": ["echo $(MSG) $$(MSG) $(NOPE)"]}
    assert command_line(container, {"MSG": "hi"}, POD) == ["sh", "-c", "echo hi $(MSG) $(NOPE)"]


def test_a_container_without_command_is_refused_with_the_reason():
    with pytest.raises(EnvError, match="has no `command`.*entrypoint is unknown"):
        command_line({"name": "c", "args": ["x"]}, {}, {"kind": "Pod", "metadata": {"name": "p"}})


def test_base_env_puts_this_interpreter_first():
    env = base_env("ddp-0", {"PATH": "/usr/bin:/bin", "HOME": "/home/u", "SECRET_TOKEN": "x", "LANG": "C.UTF-8"})
    assert env["PATH"].split(os.pathsep) == [os.path.dirname(sys.executable), "/usr/bin", "/bin"]
    assert env == {"PATH": env["PATH"], "HOME": "/home/u", "HOSTNAME": "ddp-0", "LANG": "C.UTF-8"}
