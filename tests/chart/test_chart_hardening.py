"""The chart's NetworkPolicy (value networkPolicy, issue 23 item 1), rendered by the real Helm: the admission port
admits only the API server's CIDRs and peers, the notary port stays open to gang pods, and enabling it without
saying where the API server is fails with the key to set."""

from __future__ import annotations

import pytest

from chart_render import HelmError, find, find_all, render_chart

NAMESPACE = "ml-platform"


def test_no_network_policy_unless_asked():
    assert find_all(render_chart({}, NAMESPACE), "NetworkPolicy") == []


def test_the_admission_port_admits_only_the_api_server_and_the_notary_port_every_pod():
    peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"component": "kube-apiserver"}}}
    manifests = render_chart({"networkPolicy": {"enabled": True, "apiServerCIDRs": ["10.0.0.0/28"],
                                                "apiServerPeers": [peer]}}, NAMESPACE)
    policy = find(manifests, "NetworkPolicy")
    deployment = find(manifests, "Deployment")
    assert policy["metadata"]["namespace"] == NAMESPACE
    assert policy["spec"]["podSelector"] == deployment["spec"]["selector"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    admission, notary = policy["spec"]["ingress"]
    assert admission == {"from": [{"ipBlock": {"cidr": "10.0.0.0/28"}}, peer],
                         "ports": [{"port": 9443, "protocol": "TCP"}]}
    assert notary == {"ports": [{"port": 8444, "protocol": "TCP"}]}  # no `from`: every pod may call it
    container = find(manifests, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert {p["containerPort"] for p in container["ports"]} == {9443, 8444}


def test_the_notary_port_follows_its_value():
    policy = find(render_chart({"networkPolicy": {"enabled": True, "apiServerCIDRs": ["192.168.1.10/32"]},
                                "notary": {"port": 8555}}, NAMESPACE), "NetworkPolicy")
    assert policy["spec"]["ingress"][1] == {"ports": [{"port": 8555, "protocol": "TCP"}]}


def test_enabled_without_the_api_servers_address_fails_naming_the_key():
    with pytest.raises(HelmError, match="networkPolicy.apiServerCIDRs"):
        render_chart({"networkPolicy": {"enabled": True}}, NAMESPACE)


def test_a_cidr_that_is_not_one_is_refused_by_the_schema():
    with pytest.raises(HelmError, match="apiServerCIDRs"):
        render_chart({"networkPolicy": {"enabled": True, "apiServerCIDRs": ["control-plane"]}}, NAMESPACE)
