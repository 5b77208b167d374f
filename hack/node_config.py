"""The test node's configuration, as pure functions of its paths and addresses: containerd's config.toml, the
CNI network, the kubelet's and kube-proxy's configuration files, the pods' resolv.conf, the firewall rules and
the sysctls. hack/node.py writes them and starts the processes; nothing here touches the machine, so every value
is testable (tests/repo/test_node_parts.py) and the reasons for each sit next to it.

The values are the ones /work/shared/realnode.md found necessary on these machines (root without
CAP_SYS_RESOURCE, cgroup v1 hybrid, no systemd, no registry); each is explained where it is set.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path

NODE_NAME = "trainhook-node"
BRIDGE = "trainhook0"  # at most 15 characters (IFNAMSIZ)
POD_CIDR = "10.244.0.0/24"
SERVICE_CIDR = "10.0.0.0/24"  # hack/cluster.py's
CLUSTER_DOMAIN = "cluster.local"
CNI_BIN_DIR = "/usr/lib/cni"  # Debian's containernetworking-plugins
# The pods' processes, in every cgroup v1 hierarchy: `down` kills whatever is left in it, and nothing else.
CGROUP_ROOT = "/trainhook-node"
# The comment on every iptables rule of ours, so `down` removes exactly those.
RULE_COMMENT = "trainhook-node"

# Set by us for the node (forwarding between the bridge's ports and to services; bridged traffic through
# iptables, which kube-proxy's DNAT replies need when client and endpoint share the bridge), and changed by the
# kubelet (vm.overcommit_memory, vm.panic_on_oom, kernel.panic, kernel.panic_on_oops, kernel.keys.*) and
# kube-proxy (route_localnet): all saved at `up` and restored at `down`.
SYSCTLS_SET = {"net.ipv4.ip_forward": "1", "net.bridge.bridge-nf-call-iptables": "1"}
SYSCTLS_SAVED = (*SYSCTLS_SET, "vm.overcommit_memory", "vm.panic_on_oom", "kernel.panic", "kernel.panic_on_oops",
                 "kernel.keys.root_maxkeys", "kernel.keys.root_maxbytes", "net.ipv4.conf.all.route_localnet")


def host_ip(pod_cidr: str = POD_CIDR) -> str:
    """The bridge's own address (the pods' gateway), where the API server, the kubelet and the DNS listen."""
    return str(next(ipaddress.ip_network(pod_cidr).hosts()))


def service_ip(index: int, service_cidr: str = SERVICE_CIDR) -> str:
    """The `index`-th address of the service range: 1 is the `kubernetes` Service, 10 the cluster DNS."""
    return str(ipaddress.ip_network(service_cidr).network_address + index)


DNS_IP = service_ip(10)


@dataclass(frozen=True)
class NodePaths:
    """Where everything of one node lives. `run` is wiped at each `up`; `images` (containerd's content store and
    snapshots) is kept across runs, so images are imported once."""

    run: Path
    images: Path

    @property
    def containerd_config(self) -> Path:
        return self.run / "containerd.toml"

    @property
    def containerd_socket(self) -> Path:
        return self.run / "containerd.sock"

    @property
    def containerd_state(self) -> Path:
        return self.run / "containerd-state"

    @property
    def runc_root(self) -> Path:
        return self.run / "runc"

    @property
    def cni_conf_dir(self) -> Path:
        return self.run / "cni" / "net.d"

    @property
    def cni_ipam_dir(self) -> Path:
        return self.run / "cni" / "ipam"

    @property
    def kubelet_root(self) -> Path:
        return self.run / "kubelet"

    @property
    def resolv_conf(self) -> Path:
        return self.run / "resolv.conf"

    @property
    def pki(self) -> Path:
        return self.run / "pki"


def containerd_toml(paths: NodePaths, sandbox_image: str) -> str:
    """containerd 1.6's config (version 2), everything under the node's own folders."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""\
version = 2
root = {json.dumps(str(paths.images))}
state = {json.dumps(str(paths.containerd_state))}
# Nothing here but overlayfs; the others only log that they cannot start.
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
                    "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = {json.dumps(str(paths.containerd_socket))}

[ttrpc]
  address = {json.dumps(str(paths.containerd_socket) + ".ttrpc")}

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = {json.dumps(str(paths.run / "opt"))}

[{cri}]
  # No registry is reachable: the sandbox image is built here (hack/images.py) and imported.
  sandbox_image = {json.dumps(sandbox_image)}
  # Root here lacks CAP_SYS_RESOURCE: lowering oom_score_adj fails, and every sandbox with it
  # ("can't get final child's PID from pipe").
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  # Network namespaces under our state dir, not /var/run/netns, so `down` finds (and unmounts) only ours.
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  max_container_log_line_size = 65536

  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [{cri}.containerd.runtimes.runc.options]
        # The kubelet's cgroupDriver is cgroupfs (no systemd here).
        SystemdCgroup = false
        Root = {json.dumps(str(paths.runc_root))}

  [{cri}.cni]
    bin_dir = {json.dumps(CNI_BIN_DIR)}
    conf_dir = {json.dumps(str(paths.cni_conf_dir))}
    max_conf_num = 1
"""


def cni_conflist(paths: NodePaths, pod_cidr: str = POD_CIDR) -> dict:
    """The pod network: a bridge of its own with the host as gateway, addresses from host-local. No masquerade:
    pods never leave the machine (the firewall rules below drop anything that tries)."""
    return {
        "cniVersion": "0.4.0",
        "name": "trainhook",
        "plugins": [
            {
                "type": "bridge", "bridge": BRIDGE, "isGateway": True, "hairpinMode": True, "ipMasq": False,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": pod_cidr, "gateway": host_ip(pod_cidr)}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(paths.cni_ipam_dir),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_config(paths: NodePaths, *, ca_file: Path, healthz_port: int, pod_cidr: str = POD_CIDR) -> dict:
    """KubeletConfiguration (v1beta1). Only clients with a certificate of the cluster's CA (the API server's) are
    served; the port listens on the bridge address, which pods can reach."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": host_ip(pod_cidr),
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                           "x509": {"clientCAFile": str(ca_file)}},
        "authorization": {"mode": "AlwaysAllow"},
        "tlsCertFile": str(paths.pki / "kubelet.crt"),
        "tlsPrivateKeyFile": str(paths.pki / "kubelet.key"),
        # No systemd: cgroupfs, matching containerd's SystemdCgroup = false; pods under a cgroup of their own.
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": CGROUP_ROOT,
        "cgroupsPerQOS": True,
        "enforceNodeAllocatable": ["pods"],
        "clusterDNS": [DNS_IP],
        "clusterDomain": CLUSTER_DOMAIN,
        # The pods' base resolv.conf: the cluster DNS only (names outside the cluster have no upstream here).
        "resolvConf": str(paths.resolv_conf),
        "failSwapOn": False,
        "serializeImagePulls": False,
        # A shared development machine's disk is not the node's to manage: no image GC, evictions only when the
        # disk is really full.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                         "nodefs.inodesFree": "1%"},
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        # The kubelet's default is 110; the gang-scale test and benchmark (issue 26) start gangs of 64 and 100 bare
        # pods while the pods of earlier tests may still be terminating. The pod CIDR (/24: 253 addresses, the
        # bridge's own included) is the next limit.
        "maxPods": 250,
        # The kubelet's API client limits, as kubelets since v1.27 default them (v1.20's are 5 and 10): with 5
        # requests a second, the pod status updates of a 32-pod gang queue for seconds, and with them the pods'
        # IPs, their Endpoints and their DNS names (issue 26).
        "kubeAPIQPS": 50,
        "kubeAPIBurst": 100,
        "podPidsLimit": -1,
        "staticPodPath": "",
        "syncFrequency": "10s",
        "fileCheckFrequency": "20s",
        "nodeStatusUpdateFrequency": "10s",
        "containerLogMaxSize": "10Mi",
        "containerLogMaxFiles": 2,
    }


def kubelet_args(bins: Path, paths: NodePaths, *, kubeconfig: Path, config: Path, verbosity: int = 1) -> list[str]:
    return [
        str(bins / "kubelet"),
        "--config", str(config),
        "--kubeconfig", str(kubeconfig),
        "--container-runtime", "remote",
        "--container-runtime-endpoint", f"unix://{paths.containerd_socket}",
        "--runtime-request-timeout", "5m",
        "--root-dir", str(paths.kubelet_root),
        "--cert-dir", str(paths.pki),
        "--hostname-override", NODE_NAME,
        "--node-ip", host_ip(),
        "--v", str(verbosity),
    ]


def kube_proxy_config(kubeconfig: Path, *, healthz_port: int, metrics_port: int, pod_cidr: str = POD_CIDR) -> dict:
    """KubeProxyConfiguration (v1alpha1): iptables mode, leaving the machine's conntrack settings alone
    (maxPerCore 0 and zero timeouts mean "do not set"), node ports only on the bridge address."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": NODE_NAME,
        "bindAddress": host_ip(pod_cidr),
        "clusterCIDR": pod_cidr,
        "healthzBindAddress": f"127.0.0.1:{healthz_port}",
        "metricsBindAddress": f"127.0.0.1:{metrics_port}",
        "nodePortAddresses": [f"{host_ip(pod_cidr)}/32"],
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        "iptables": {"masqueradeAll": False, "syncPeriod": "30s", "minSyncPeriod": "0s"},
    }


def pods_resolv_conf() -> str:
    return f"# trainhook node: the cluster DNS (hack/cluster_dns.py) through the kube-dns Service\n" \
           f"nameserver {DNS_IP}\n"


def firewall_rules(pod_cidr: str = POD_CIDR) -> list[list[str]]:
    """iptables rules (table, chain, match...) that keep pods on this machine: nothing is forwarded between the
    bridge and any other interface, either way. In the mangle table, which kube-proxy never touches, so none of
    its filter-table ACCEPTs can come first. Pods still reach the host's own addresses (the API server, DNS)."""
    tag = ["-m", "comment", "--comment", RULE_COMMENT]
    return [
        ["-t", "mangle", "FORWARD", "-i", BRIDGE, "!", "-o", BRIDGE, *tag, "-j", "DROP"],
        ["-t", "mangle", "FORWARD", "-o", BRIDGE, "!", "-i", BRIDGE, *tag, "-j", "DROP"],
    ]


def dns_service_objects(dns_ip: str = DNS_IP, host: str | None = None) -> tuple[dict, dict]:
    """The kube-dns Service at the cluster DNS address and its Endpoints (no selector: the server runs on the
    host, at the bridge address), as the kubelet's clusterDNS expects on any cluster."""
    host = host or host_ip()
    labels = {"k8s-app": "kube-dns", "kubernetes.io/name": "trainhook-cluster-dns"}
    ports = [{"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": labels},
               "spec": {"clusterIP": dns_ip, "ports": [{**p, "targetPort": 53} for p in ports]}}
    endpoints = {"apiVersion": "v1", "kind": "Endpoints",
                 "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": labels},
                 "subsets": [{"addresses": [{"ip": host}], "ports": ports}]}
    return service, endpoints
