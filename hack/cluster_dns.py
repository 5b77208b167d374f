#!/usr/bin/env python3
"""The test node's cluster DNS: Services and Endpoints from the API server, answered as Kubernetes' DNS-based
service discovery specification (v1.1.0) says. No CoreDNS or kube-dns can be installed here (no registry), so this
small server runs on the host, at the bridge address, behind the `kube-dns` Service (hack/node.py).

    python hack/cluster_dns.py --kubeconfig K --listen 10.244.0.1:53 [--domain cluster.local]

What it answers, for zone `<domain>` (short TTL, so tests see changes within seconds):
- `<svc>.<ns>.svc.<zone>` A: the ClusterIP; for a headless Service, one A per ready endpoint address.
- `<hostname>.<svc>.<ns>.svc.<zone>` A: an endpoint address that has a hostname (a StatefulSet's pods, a pod
  with `hostname` + `subdomain`).
- Only the Endpoints' `addresses` count, never `notReadyAddresses`: `publishNotReadyAddresses` is what moves a
  not-ready pod into `addresses` (the endpoints controller does it), so peers of a gang resolve before Ready
  exactly when the Service asks for it.
- `_<port>._<proto>.<svc>.<ns>.svc.<zone>` SRV for named ports (ClusterIP: the service name; headless: each
  endpoint's hostname, or its dashed address when it has none).
- ExternalName Services: a CNAME. `<a-b-c-d>.<ns>.pod.<zone>` A. PTR for service and endpoint addresses.
  `dns-version.<zone>` TXT "1.1.0".
- Counting, for the tests and benchmarks that measure what a gang costs the cluster DNS (issue 26): every query
  answered is counted by name. `_queries.<zone>` TXT answers the totals; `<text>._queries.<zone>` TXT the totals
  of the names that contain `<text>` (a gang's name, a namespace), then its most asked names. These questions are
  not counted themselves. `query_counts()` (tests/e2e/test_e2e_gang_scale.py) asks them.
- A name that exists with no record of the type asked: NOERROR without answers (NODATA); a name that does not
  exist (no record at or below it): NXDOMAIN; both with the zone's SOA. Names outside the zone: REFUSED (no
  upstream: pods never leave this machine).

`Records.resolve()` is pure (tests/repo/test_cluster_dns.py); the watch and the dnslib server are the I/O around it.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import signal
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

TTL = 5
NOERROR, NXDOMAIN, REFUSED = 0, 3, 5
SPEC_VERSION = "1.1.0"
STATS_LABEL = "_queries"  # `[<text>.]_queries.<zone>` TXT: the query counts (QueryCounter)
MAX_COUNTED_NAMES = 100_000  # beyond this many distinct names, new ones are counted under "(other)" only


@dataclass(frozen=True)
class RR:
    name: str  # lower case, no trailing dot
    rtype: str  # A, SRV, CNAME, PTR, TXT
    data: tuple  # A: (ip,), SRV: (priority, weight, port, target), CNAME/PTR: (target,), TXT: (text,)


@dataclass
class Answer:
    rcode: int
    records: list[RR] = field(default_factory=list)
    authoritative: bool = True


def _dashed(ip: str) -> str:
    return ip.replace(".", "-").replace(":", "-")


def _reverse_name(ip: str) -> str:
    return ipaddress.ip_address(ip).reverse_pointer


def service_records(service: dict, endpoints: dict | None, domain: str) -> list[RR]:
    """The records one Service (and its Endpoints, when it has any) gives, per the specification."""
    meta, spec = service["metadata"], service.get("spec") or {}
    fqdn = f"{meta['name']}.{meta['namespace']}.svc.{domain}".lower()
    stype = spec.get("type") or "ClusterIP"
    if stype == "ExternalName":
        return [RR(fqdn, "CNAME", (spec.get("externalName", "").rstrip(".").lower(),))]
    cluster_ip = spec.get("clusterIP")
    records: list[RR] = []
    named_ports = [p for p in spec.get("ports") or [] if p.get("name")]
    if cluster_ip and cluster_ip != "None":
        records.append(RR(fqdn, "A", (cluster_ip,)))
        records.append(RR(_reverse_name(cluster_ip), "PTR", (fqdn,)))
        for p in named_ports:
            proto = (p.get("protocol") or "TCP").lower()
            records.append(RR(f"_{p['name']}._{proto}.{fqdn}".lower(), "SRV", (0, 100, p["port"], fqdn)))
        return records
    # Headless: the ready endpoint addresses (the `addresses` list only).
    for subset in (endpoints or {}).get("subsets") or []:
        for address in subset.get("addresses") or []:
            ip = address["ip"]
            records.append(RR(fqdn, "A", (ip,)))
            label = (address.get("hostname") or _dashed(ip)).lower()
            target = f"{label}.{fqdn}"
            records.append(RR(target, "A", (ip,)))
            if address.get("hostname"):
                records.append(RR(_reverse_name(ip), "PTR", (target,)))
            for p in subset.get("ports") or []:
                if p.get("name"):
                    proto = (p.get("protocol") or "TCP").lower()
                    records.append(RR(f"_{p['name']}._{proto}.{fqdn}".lower(), "SRV", (0, 100, p["port"], target)))
    return records


class Records:
    """Every record of the zone, rebuilt from the current Services and Endpoints. Thread-safe reads."""

    def __init__(self, domain: str = "cluster.local"):
        self.domain = domain.lower().rstrip(".")
        self._by_name: dict[str, list[RR]] = {}
        self._names: set[str] = set()  # every name with records, and every name above one (empty non-terminals)
        self._lock = threading.Lock()

    def rebuild(self, services: list[dict], endpoints: list[dict]) -> None:
        eps = {(e["metadata"]["namespace"], e["metadata"]["name"]): e for e in endpoints}
        by_name: dict[str, list[RR]] = defaultdict(list)
        for svc in services:
            key = (svc["metadata"]["namespace"], svc["metadata"]["name"])
            for rr in service_records(svc, eps.get(key), self.domain):
                if rr not in by_name[rr.name]:
                    by_name[rr.name].append(rr)
        by_name[f"dns-version.{self.domain}"].append(RR(f"dns-version.{self.domain}", "TXT", (SPEC_VERSION,)))
        names: set[str] = set()
        for name in by_name:
            labels = name.split(".")
            for i in range(len(labels)):
                names.add(".".join(labels[i:]))
        namespaces = {s["metadata"]["namespace"] for s in services}
        names |= {f"{ns}.svc.{self.domain}" for ns in namespaces} | {f"svc.{self.domain}", self.domain}
        with self._lock:
            self._by_name, self._names = dict(by_name), names

    def in_zone(self, name: str) -> bool:
        return name == self.domain or name.endswith("." + self.domain) or name.endswith(".in-addr.arpa")

    def resolve(self, qname: str, qtype: str) -> Answer:
        """The answer to one question: records, NODATA (NOERROR, none) or NXDOMAIN; REFUSED outside the zone."""
        name = qname.lower().rstrip(".")
        if not self.in_zone(name):
            return Answer(REFUSED, authoritative=False)
        pod = self._pod_record(name)
        with self._lock:
            found = list(self._by_name.get(name, [])) + ([pod] if pod else [])
            exists = bool(found) or name in self._names
        if not exists:
            return Answer(NXDOMAIN)
        if qtype == "ANY":
            return Answer(NOERROR, found)
        matching = [rr for rr in found if rr.rtype == qtype]
        if not matching and qtype != "CNAME":
            # A CNAME answers every type (the resolver follows it; its target is outside our records).
            matching = [rr for rr in found if rr.rtype == "CNAME"]
        return Answer(NOERROR, matching)

    def _pod_record(self, name: str) -> RR | None:
        """`<a-b-c-d>.<ns>.pod.<zone>`: the address spelled in the name (the specification's pod A record)."""
        suffix = f".pod.{self.domain}"
        if not name.endswith(suffix):
            return None
        labels = name[: -len(suffix)].split(".")
        if len(labels) != 2:
            return None
        try:
            ip = str(ipaddress.IPv4Address(labels[0].replace("-", ".")))
        except ValueError:
            return None
        return RR(name, "A", (ip,))


class QueryCounter:
    """Every query the server answered, by name (lower case, no trailing dot), type and answer code.

    Why: the gang wait's cost to the cluster DNS is what issue 26 is about (every pod resolving every peer was
    O(N^2) queries); a test on the node asks these counts before and after a gang forms. Thread-safe: dnslib
    answers each query on its own thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.by_name: Counter = Counter()
        self.nxdomain: Counter = Counter()
        self.tcp: Counter = Counter()

    def count(self, name: str, rcode: int, tcp: bool = False) -> None:
        name = name.lower().rstrip(".")
        with self._lock:
            if name not in self.by_name and len(self.by_name) >= MAX_COUNTED_NAMES:
                name = "(other)"
            self.by_name[name] += 1
            if rcode == NXDOMAIN:
                self.nxdomain[name] += 1
            if tcp:
                self.tcp[name] += 1

    def totals(self, containing: str = "", top: int = 10) -> tuple[dict, list[tuple[str, int]]]:
        """The totals over the names that contain `containing` (every name for ""), and its `top` names."""
        containing = containing.lower()
        with self._lock:
            names = [n for n in self.by_name if containing in n]
            totals = {"queries": sum(self.by_name[n] for n in names), "names": len(names),
                      "nxdomain": sum(self.nxdomain[n] for n in names), "tcp": sum(self.tcp[n] for n in names)}
            most = sorted(((n, self.by_name[n]) for n in names), key=lambda item: (-item[1], item[0]))[:top]
        return totals, most

    def stats_question(self, qname: str, domain: str) -> str | None:
        """`containing` for a stats question (`[<text>.]_queries.<zone>`); None for any other name."""
        name = qname.lower().rstrip(".")
        suffix = f"{STATS_LABEL}.{domain}"
        if name == suffix:
            return ""
        if name.endswith("." + suffix):
            return name[: -len(suffix) - 1]
        return None

    def stats_texts(self, containing: str) -> list[str]:
        """The TXT strings of a stats answer: `queries=Q names=K nxdomain=X tcp=T`, then `name=count` of the most
        asked names (each string at most 255 bytes, as TXT allows)."""
        totals, most = self.totals(containing)
        head = " ".join(f"{key}={value}" for key, value in totals.items())
        return [head] + [f"{name}={count}"[:255] for name, count in most]


def parse_stats(texts: list[str]) -> dict:
    """A stats answer's strings back into {"queries": Q, ..., "top": {name: count}} (the tests' side)."""
    head, *most = texts
    stats: dict = {key: int(value) for key, value in (item.split("=", 1) for item in head.split())}
    stats["top"] = {name: int(count) for name, count in (item.rsplit("=", 1) for item in most)}
    return stats


def query_counts(host: str, port: int = 53, containing: str = "", domain: str = "cluster.local") -> dict:
    """Ask the server at host:port (over TCP: the answer can outgrow a UDP datagram) how many queries it answered
    for the names that contain `containing`: {"queries", "names", "nxdomain", "tcp", "top": {name: count}}."""
    from dnslib import QTYPE, DNSRecord
    name = ".".join(part for part in (containing, STATS_LABEL, domain) if part)
    reply = DNSRecord.parse(DNSRecord.question(name, "TXT").send(host, port, tcp=True, timeout=5))
    texts = [part.decode() for rr in reply.rr if rr.rtype == QTYPE.TXT for part in rr.rdata.data]
    if not texts:
        raise RuntimeError(f"{host}:{port} did not answer the stats question {name} (rcode {reply.header.rcode})")
    return parse_stats(texts)


# ---- I/O: the watch and the server -------------------------------------------------------------------------------

class Watcher:
    """Keeps `records` current: lists Services and Endpoints, then watches both; re-lists after any error."""

    def __init__(self, records: Records, api_client, log: logging.Logger):
        self.records, self.api, self.log = records, api_client, log
        self.objects: dict[str, dict[tuple[str, str], dict]] = {"services": {}, "endpoints": {}}
        self.lock = threading.Lock()
        self.synced = threading.Event()
        self._listed: set[str] = set()

    def _rebuild(self) -> None:
        with self.lock:
            services, endpoints = list(self.objects["services"].values()), list(self.objects["endpoints"].values())
        self.records.rebuild(services, endpoints)

    def run(self, kind: str) -> None:
        from kubernetes import client, watch
        core = client.CoreV1Api(self.api)
        list_fn = core.list_service_for_all_namespaces if kind == "services" else \
            core.list_endpoints_for_all_namespaces
        while True:
            try:
                listed = self.api.sanitize_for_serialization(list_fn())
                with self.lock:
                    self.objects[kind] = {(o["metadata"]["namespace"], o["metadata"]["name"]): o
                                          for o in listed.get("items") or []}
                self._rebuild()
                self._listed.add(kind)
                if self._listed == {"services", "endpoints"}:
                    self.synced.set()
                w = watch.Watch()
                for event in w.stream(list_fn, resource_version=listed["metadata"]["resourceVersion"],
                                      timeout_seconds=300, _request_timeout=330):
                    obj = self.api.sanitize_for_serialization(event["object"])
                    if event["type"] == "ERROR":
                        break
                    key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
                    with self.lock:
                        if event["type"] == "DELETED":
                            self.objects[kind].pop(key, None)
                        else:
                            self.objects[kind][key] = obj
                    self._rebuild()
            except Exception as e:  # noqa: BLE001  the API server may restart; keep serving the last records
                self.log.warning("watch of %s failed (%s); listing again", kind, e)
                time.sleep(1)


def make_resolver(records: Records, log: logging.Logger, counter: QueryCounter | None = None):
    from dnslib import CNAME, PTR, QTYPE, RR as DnsRR, SOA, SRV, TXT, A
    from dnslib.server import BaseResolver
    counter = counter if counter is not None else QueryCounter()

    rdata = {"A": lambda d: A(d[0]), "SRV": lambda d: SRV(d[0], d[1], d[2], d[3] + "."),
             "CNAME": lambda d: CNAME(d[0] + "."), "PTR": lambda d: PTR(d[0] + "."), "TXT": lambda d: TXT(d[0])}
    soa = SOA(f"ns.dns.{records.domain}.", f"hostmaster.{records.domain}.", (1, 7200, 1800, 86400, TTL))

    class Resolver(BaseResolver):
        def resolve(self, request, handler):
            reply = request.reply()
            q = request.q
            containing = counter.stats_question(str(q.qname), records.domain)
            if containing is not None:  # a stats question: answered, not counted
                reply.add_answer(DnsRR(str(q.qname), QTYPE.TXT, ttl=0, rdata=TXT(counter.stats_texts(containing))))
                return reply
            answer = records.resolve(str(q.qname), QTYPE.get(q.qtype, str(q.qtype)))
            counter.count(str(q.qname), answer.rcode, tcp=getattr(handler, "protocol", "") == "tcp")
            reply.header.rcode = answer.rcode
            reply.header.aa = int(answer.authoritative)
            for rr in answer.records:
                reply.add_answer(DnsRR(rr.name + ".", getattr(QTYPE, rr.rtype), ttl=TTL,
                                       rdata=rdata[rr.rtype](rr.data)))
            if answer.rcode in (NOERROR, NXDOMAIN) and not answer.records:
                reply.add_auth(DnsRR(records.domain + ".", QTYPE.SOA, ttl=TTL, rdata=soa))
            return reply

    resolver = Resolver()
    resolver.counter = counter
    return resolver


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--listen", default="10.244.0.1:53", help="address:port, UDP and TCP")
    parser.add_argument("--domain", default="cluster.local")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s cluster-dns %(levelname)s %(message)s")
    log = logging.getLogger("cluster-dns")

    from dnslib.server import DNSLogger, DNSServer
    from kubernetes import config
    records = Records(args.domain)
    watcher = Watcher(records, config.new_client_from_config(config_file=args.kubeconfig), log)
    for kind in ("services", "endpoints"):
        threading.Thread(target=watcher.run, args=(kind,), daemon=True, name=f"watch-{kind}").start()
    if not watcher.synced.wait(60):
        log.error("no list of Services and Endpoints within 60s")
        return 1
    host, _, port = args.listen.rpartition(":")
    resolver = make_resolver(records, log)
    quiet = DNSLogger(log="-request,-reply,-truncated,-error,-recv,-send,-data", prefix=False)
    servers = [DNSServer(resolver, address=host, port=int(port), tcp=tcp, logger=quiet) for tcp in (False, True)]
    for server in servers:
        server.start_thread()
    log.info("serving zone %s on %s (UDP and TCP)", args.domain, args.listen)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    for server in servers:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
