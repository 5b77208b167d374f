"""The chart's ServiceMonitor (value metrics.serviceMonitor, docs/operate/metrics.md), rendered by the real Helm: none
by default; enabled, a Prometheus Operator ServiceMonitor that scrapes the webhook Service's https port at /metrics
over HTTPS, verifying the serving certificate for the Service's DNS name against ca.crt of the TLS Secret, or with
the tlsConfig given; the schema refuses what the template does not read."""

from __future__ import annotations

import datetime as dt

import pytest

from chart_render import HelmError, find, find_all, render_chart
from trainhook.certs.build import build_ca

NAMESPACE = "ml-platform"
FULLNAME = "th-metrics"


def enabled(**settings) -> list[dict]:
    return render_chart({"fullnameOverride": FULLNAME, "metrics": {"serviceMonitor": {"enabled": True, **settings}}},
                        NAMESPACE)


def test_no_service_monitor_unless_asked():
    assert find_all(render_chart({}, NAMESPACE), "ServiceMonitor") == []
    assert find_all(render_chart({"metrics": {"serviceMonitor": {"enabled": False}}}, NAMESPACE),
                    "ServiceMonitor") == []


def test_it_scrapes_the_services_https_port_verifying_the_serving_certificate():
    manifests = enabled()
    monitor = find(manifests, "ServiceMonitor")
    service = find(manifests, "Service", FULLNAME)
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert (monitor["metadata"]["name"], monitor["metadata"]["namespace"]) == (FULLNAME, NAMESPACE)
    # It selects the webhook's Service (its labels), and only in the release namespace.
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert selector["app.kubernetes.io/component"] == "webhook"
    for other in find_all(manifests, "Service"):
        if other is not service:
            assert not selector.items() <= other["metadata"]["labels"].items(), other["metadata"]["name"]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    # The Service's port named https, which reaches the pods' admission port, where /metrics is served.
    (endpoint,) = monitor["spec"]["endpoints"]
    (https,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    assert endpoint["port"] == "https" and https["targetPort"] == "https"
    container = find(manifests, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert {p["name"]: p["containerPort"] for p in container["ports"]}["https"] == 9443
    assert (endpoint["scheme"], endpoint["path"]) == ("https", "/metrics")
    assert (endpoint["interval"], endpoint["scrapeTimeout"]) == ("30s", "10s")
    # The certificate is checked, for the name it was issued to, against the CA the chart's TLS Secret holds.
    assert endpoint["tlsConfig"] == {"serverName": f"{FULLNAME}.{NAMESPACE}.svc",
                                     "ca": {"secret": {"name": f"{FULLNAME}-tls", "key": "ca.crt"}}}
    assert "insecureSkipVerify" not in str(monitor)


def test_labels_interval_timeout_and_tls_config_follow_the_values():
    tls = {"serverName": "webhook.example", "ca": {"configMap": {"name": "my-ca", "key": "ca.pem"}}}
    monitor = find(enabled(labels={"release": "prometheus"}, interval="15s", scrapeTimeout="5s", tlsConfig=tls),
                   "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["metadata"]["labels"]["app.kubernetes.io/instance"] == "trainhook"  # the chart's own kept
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["interval"], endpoint["scrapeTimeout"]) == ("15s", "5s")
    assert endpoint["tlsConfig"] == tls  # replaces the default, not merged into it


def test_in_mode_secret_it_reads_the_ca_of_the_named_secret():
    values = {"fullnameOverride": FULLNAME, "metrics": {"serviceMonitor": {"enabled": True}},
              "certificates": {"mode": "secret", "secretName": "my-tls",
                               "caBundle": build_ca("ca", dt.datetime.now(dt.timezone.utc)).cert_pem.decode()}}
    (endpoint,) = find(render_chart(values, NAMESPACE), "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["tlsConfig"]["ca"] == {"secret": {"name": "my-tls", "key": "ca.crt"}}


@pytest.mark.parametrize("values", [{"metrics": {"serviceMonitor": {"enabled": "yes"}}},
                                    {"metrics": {"serviceMonitor": {"labels": {"tier": 1}}}},
                                    {"metrics": {"serviceMonitor": {"port": "http"}}},
                                    {"metrics": {"prometheusRule": {}}}])
def test_the_schema_refuses_what_the_template_does_not_read(values):
    with pytest.raises(HelmError, match="metrics"):
        render_chart(values, NAMESPACE)
