"""The node's cluster DNS (hack/cluster_dns.py): the records Kubernetes' DNS specification asks for, computed from
Services and Endpoints as the API server returns them, and answered over UDP by the real dnslib server.
tests/e2e/test_e2e_dns.py asks the same questions from inside pods on the node."""

from __future__ import annotations

import importlib.util
import socket
import sys
from pathlib import Path

import pytest

HACK = Path(__file__).resolve().parents[2] / "hack"
spec = importlib.util.spec_from_file_location("trainhook_hack_cluster_dns", HACK / "cluster_dns.py")
dns = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = dns
spec.loader.exec_module(dns)

ZONE = "cluster.local"


def service(name, ns="ml", cluster_ip="10.0.0.20", ports=(("http", 80, "TCP"),), **spec_extra):
    return {"metadata": {"name": name, "namespace": ns},
            "spec": {"clusterIP": cluster_ip, "ports": [{"name": n, "port": p, "protocol": pr} for n, p, pr in ports],
                     **spec_extra}}


def endpoints(name, ns="ml", ready=(), not_ready=(), ports=(("http", 8080, "TCP"),)):
    """`ready`/`not_ready`: (ip, hostname or None) pairs."""
    def addresses(pairs):
        return [{"ip": ip, **({"hostname": h} if h else {})} for ip, h in pairs]
    return {"metadata": {"name": name, "namespace": ns},
            "subsets": [{"addresses": addresses(ready), "notReadyAddresses": addresses(not_ready),
                         "ports": [{"name": n, "port": p, "protocol": pr} for n, p, pr in ports]}]}


@pytest.fixture
def records():
    r = dns.Records(ZONE)
    r.rebuild(
        [service("web"), service("ddp", cluster_ip="None"), service("strict", cluster_ip="None"),
         service("docs", type="ExternalName", externalName="docs.example.org", cluster_ip=None)],
        [endpoints("web", ready=[("10.244.0.5", None)]),
         endpoints("ddp", ready=[("10.244.0.7", "ddp-0"), ("10.244.0.8", "ddp-1")]),
         endpoints("strict", not_ready=[("10.244.0.9", "strict-0")])])
    return r


def ips(answer):
    return sorted(rr.data[0] for rr in answer.records if rr.rtype == "A")


def test_a_cluster_ip_service_answers_its_cluster_ip(records):
    answer = records.resolve(f"web.ml.svc.{ZONE}.", "A")
    assert answer.rcode == dns.NOERROR and ips(answer) == ["10.0.0.20"]


def test_a_headless_service_answers_its_ready_endpoints_and_each_hostname(records):
    assert ips(records.resolve(f"ddp.ml.svc.{ZONE}", "A")) == ["10.244.0.7", "10.244.0.8"]
    assert ips(records.resolve(f"ddp-1.ddp.ml.svc.{ZONE}", "A")) == ["10.244.0.8"]
    assert ips(records.resolve(f"DDP-0.ddp.ML.svc.{ZONE}", "A")) == ["10.244.0.7"]  # names are case-insensitive


def test_not_ready_addresses_are_never_answered(records):
    # publishNotReadyAddresses is what moves them into `addresses`; the endpoints controller does that, not DNS.
    assert records.resolve(f"strict-0.strict.ml.svc.{ZONE}", "A").rcode == dns.NXDOMAIN
    assert records.resolve(f"strict.ml.svc.{ZONE}", "A").rcode == dns.NXDOMAIN


def test_srv_records_for_named_ports(records):
    (srv,) = records.resolve(f"_http._tcp.web.ml.svc.{ZONE}", "SRV").records
    assert srv.data == (0, 100, 80, f"web.ml.svc.{ZONE}")
    targets = sorted(rr.data for rr in records.resolve(f"_http._tcp.ddp.ml.svc.{ZONE}", "SRV").records)
    assert targets == [(0, 100, 8080, f"ddp-0.ddp.ml.svc.{ZONE}"), (0, 100, 8080, f"ddp-1.ddp.ml.svc.{ZONE}")]


def test_an_endpoint_without_hostname_gets_its_dashed_address(records):
    assert ips(records.resolve(f"10-244-0-5.web.ml.svc.{ZONE}", "A")) == []  # web is not headless
    r = dns.Records(ZONE)
    r.rebuild([service("h", cluster_ip="None")], [endpoints("h", ready=[("10.244.0.6", None)])])
    assert ips(r.resolve(f"10-244-0-6.h.ml.svc.{ZONE}", "A")) == ["10.244.0.6"]


def test_nodata_for_an_existing_name_and_nxdomain_for_a_missing_one(records):
    nodata = records.resolve(f"web.ml.svc.{ZONE}", "AAAA")
    assert nodata.rcode == dns.NOERROR and nodata.records == []
    for name in (f"ml.svc.{ZONE}", f"svc.{ZONE}"):  # names above a record exist too
        assert records.resolve(name, "A").rcode == dns.NOERROR
    assert records.resolve(f"nope.ml.svc.{ZONE}", "A").rcode == dns.NXDOMAIN
    assert records.resolve(f"web.other.svc.{ZONE}", "A").rcode == dns.NXDOMAIN


def test_names_outside_the_zone_are_refused(records):
    answer = records.resolve("pypi.org.", "A")
    assert answer.rcode == dns.REFUSED and not answer.authoritative


def test_external_name_pod_ptr_and_version_records(records):
    (cname,) = records.resolve(f"docs.ml.svc.{ZONE}", "A").records
    assert cname.rtype == "CNAME" and cname.data == ("docs.example.org",)
    assert ips(records.resolve(f"10-244-0-3.ml.pod.{ZONE}", "A")) == ["10.244.0.3"]
    (ptr,) = records.resolve("8.0.244.10.in-addr.arpa", "PTR").records
    assert ptr.data == (f"ddp-1.ddp.ml.svc.{ZONE}",)
    (ptr,) = records.resolve("20.0.0.10.in-addr.arpa", "PTR").records
    assert ptr.data == (f"web.ml.svc.{ZONE}",)
    (txt,) = records.resolve(f"dns-version.{ZONE}", "TXT").records
    assert txt.data == ("1.1.0",)


def test_the_server_answers_over_udp_with_short_ttls_and_the_zones_soa(records):
    from dnslib import DNSRecord
    from dnslib.server import DNSLogger, DNSServer
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = DNSServer(dns.make_resolver(records, None), address="127.0.0.1", port=port,
                       logger=DNSLogger(log="-request,-reply,-truncated,-error,-recv,-send,-data", prefix=False))
    server.start_thread()
    try:
        def ask(name, qtype="A"):
            return DNSRecord.parse(DNSRecord.question(name, qtype).send("127.0.0.1", port, timeout=5))
        reply = ask(f"ddp-0.ddp.ml.svc.{ZONE}")
        assert reply.header.rcode == 0 and reply.header.aa == 1
        assert [(str(rr.rdata), rr.ttl) for rr in reply.rr] == [("10.244.0.7", dns.TTL)]
        missing = ask(f"nope.ml.svc.{ZONE}")
        assert missing.header.rcode == 3 and missing.auth and missing.auth[0].rtype == 6  # NXDOMAIN, SOA
        srv = ask(f"_http._tcp.web.ml.svc.{ZONE}", "SRV")
        assert str(srv.rr[0].rdata) == f"0 100 80 web.ml.svc.{ZONE}."
        assert ask("pypi.org").header.rcode == 5
    finally:
        server.stop()


# --- counting queries (issue 26: what a gang's wait costs the cluster DNS) ---------------------------------------

def test_the_server_counts_the_queries_it_answers_by_name_and_answers_the_counts(records):
    """Real queries over UDP and TCP; the counts come back through the stats question, which is not counted."""
    from dnslib import DNSRecord
    from dnslib.server import DNSLogger, DNSServer
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    resolver = dns.make_resolver(records, None)
    quiet = DNSLogger(log="-request,-reply,-truncated,-error,-recv,-send,-data", prefix=False)
    servers = [DNSServer(resolver, address="127.0.0.1", port=port, tcp=tcp, logger=quiet) for tcp in (False, True)]
    for server in servers:
        server.start_thread()
    try:
        def ask(name, qtype="A", tcp=False):
            return DNSRecord.parse(DNSRecord.question(name, qtype).send("127.0.0.1", port, tcp=tcp, timeout=5))
        for _ in range(3):
            ask(f"ddp-0.ddp.ml.svc.{ZONE}")
        ask(f"DDP-0.ddp.ml.svc.{ZONE}.", "AAAA", tcp=True)  # the same name: case and the final dot do not matter
        ask(f"ddp-7.ddp.ml.svc.{ZONE}")  # NXDOMAIN
        ask(f"web.ml.svc.{ZONE}")
        before = dns.query_counts("127.0.0.1", port)
        assert {k: before[k] for k in ("queries", "names", "nxdomain", "tcp")} == \
            {"queries": 6, "names": 3, "nxdomain": 1, "tcp": 1}
        assert before["top"] == {f"ddp-0.ddp.ml.svc.{ZONE}": 4, f"ddp-7.ddp.ml.svc.{ZONE}": 1,
                                 f"web.ml.svc.{ZONE}": 1}
        gang = dns.query_counts("127.0.0.1", port, containing="ddp")
        assert gang["queries"] == 5 and gang["names"] == 2 and gang["nxdomain"] == 1
        assert dns.query_counts("127.0.0.1", port, containing="nothing-like-this")["queries"] == 0
        assert dns.query_counts("127.0.0.1", port)["queries"] == 6  # asking did not count
    finally:
        for server in servers:
            server.stop()


def test_the_counter_keeps_a_bounded_number_of_names(monkeypatch):
    monkeypatch.setattr(dns, "MAX_COUNTED_NAMES", 3)
    counter = dns.QueryCounter()
    for i in range(5):
        counter.count(f"n{i}.ml.svc.{ZONE}", dns.NXDOMAIN)
    totals, most = counter.totals()
    assert totals == {"queries": 5, "names": 4, "nxdomain": 5, "tcp": 0}
    assert dict(most)["(other)"] == 2
