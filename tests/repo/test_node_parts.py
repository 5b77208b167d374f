"""The node's pure parts, without starting it: the configuration hack/node.py writes (hack/node_config.py), the
host clean-up it plans (hack/node_host.py) and the image keys (hack/images.py). The node itself is exercised by
tests/e2e."""

from __future__ import annotations

import ipaddress
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hack"))
import images  # noqa: E402
import node_config as cfg  # noqa: E402
import node_host as host  # noqa: E402

PATHS = cfg.NodePaths(run=Path("/state/node/run"), images=Path("/state/node/containerd"))


def test_the_node_addresses_are_private_and_consistent():
    pods, services = ipaddress.ip_network(cfg.POD_CIDR), ipaddress.ip_network(cfg.SERVICE_CIDR)
    assert pods.is_private and services.is_private and not pods.overlaps(services)
    assert cfg.host_ip() == "10.244.0.1" and ipaddress.ip_address(cfg.host_ip()) in pods
    assert cfg.DNS_IP == "10.0.0.10" and cfg.service_ip(1) == "10.0.0.1"
    assert len(cfg.BRIDGE) <= 15


def test_containerd_runs_what_this_machine_allows():
    config = tomllib.loads(cfg.containerd_toml(PATHS, "localhost/trainhook/pause:k"))
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["restrict_oom_score_adj"] is True  # no CAP_SYS_RESOURCE for root here
    assert cri["sandbox_image"] == "localhost/trainhook/pause:k"
    assert cri["disable_apparmor"] is True and cri["netns_mounts_under_state_dir"] is True
    runc = cri["containerd"]["runtimes"]["runc"]
    assert runc["runtime_type"] == "io.containerd.runc.v2" and runc["options"]["SystemdCgroup"] is False
    assert cri["cni"] == {"bin_dir": "/usr/lib/cni", "conf_dir": str(PATHS.cni_conf_dir), "max_conf_num": 1}
    # Everything of its own under the node's folders; images kept apart from the state wiped at each `up`.
    assert config["root"] == str(PATHS.images) and config["state"].startswith(str(PATHS.run))
    assert config["grpc"]["address"].startswith(str(PATHS.run))


def test_the_pod_network_is_a_bridge_of_its_own_without_masquerade():
    bridge, portmap = cfg.cni_conflist(PATHS)["plugins"]
    assert bridge["bridge"] == cfg.BRIDGE and bridge["isGateway"] and bridge["hairpinMode"]
    assert bridge["ipMasq"] is False
    assert bridge["ipam"]["ranges"] == [[{"subnet": cfg.POD_CIDR, "gateway": cfg.host_ip()}]]
    assert portmap["type"] == "portmap"


def test_pods_never_leave_the_machine():
    rules = cfg.firewall_rules()
    assert ["-t", "mangle", "FORWARD", "-i", cfg.BRIDGE, "!", "-o", cfg.BRIDGE] == rules[0][:8]
    assert ["-t", "mangle", "FORWARD", "-o", cfg.BRIDGE, "!", "-i", cfg.BRIDGE] == rules[1][:8]
    assert all(rule[-2:] == ["-j", "DROP"] and cfg.RULE_COMMENT in rule for rule in rules)


def test_kubelet_and_kube_proxy_configuration():
    kubelet = cfg.kubelet_config(PATHS, ca_file=Path("/ca.crt"), healthz_port=1234)
    assert kubelet["cgroupDriver"] == "cgroupfs" and kubelet["cgroupRoot"] == cfg.CGROUP_ROOT
    assert kubelet["clusterDNS"] == [cfg.DNS_IP] and kubelet["clusterDomain"] == "cluster.local"
    assert kubelet["resolvConf"] == str(PATHS.resolv_conf)
    assert kubelet["authentication"]["anonymous"]["enabled"] is False and kubelet["readOnlyPort"] == 0
    args = cfg.kubelet_args(Path("/bin"), PATHS, kubeconfig=Path("/k"), config=Path("/c"))
    assert args[args.index("--node-ip") + 1] == cfg.host_ip()
    assert args[args.index("--container-runtime-endpoint") + 1] == f"unix://{PATHS.containerd_socket}"
    proxy = cfg.kube_proxy_config(Path("/k"), healthz_port=1, metrics_port=2)
    assert proxy["mode"] == "iptables" and proxy["conntrack"]["maxPerCore"] == 0
    assert proxy["clusterCIDR"] == cfg.POD_CIDR
    assert cfg.pods_resolv_conf().strip().endswith(f"nameserver {cfg.DNS_IP}")


def test_the_saved_sysctls_cover_every_one_the_node_changes():
    assert set(cfg.SYSCTLS_SET) <= set(cfg.SYSCTLS_SAVED)
    assert {"vm.overcommit_memory", "kernel.panic", "kernel.panic_on_oops"} <= set(cfg.SYSCTLS_SAVED)


def test_the_dns_service_has_the_cluster_dns_address_and_the_host_behind_it():
    service, endpoints = cfg.dns_service_objects()
    assert service["metadata"] == endpoints["metadata"] and service["metadata"]["name"] == "kube-dns"
    assert service["spec"]["clusterIP"] == cfg.DNS_IP and "selector" not in service["spec"]
    assert endpoints["subsets"][0]["addresses"] == [{"ip": cfg.host_ip()}]


IPTABLES_SAVE = """\
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:KUBE-FIREWALL - [0:0]
:DOCKER-USER - [0:0]
-A INPUT -j KUBE-FIREWALL
-A INPUT -j DOCKER-USER
-A KUBE-FIREWALL -m comment --comment "kubernetes firewall for dropping marked packets" -m mark --mark 0x8000/0x8000 -j DROP
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
COMMIT
"""


def test_the_kubelets_and_kube_proxys_chains_and_only_theirs_are_removed():
    commands = host.kube_chain_cleanup(IPTABLES_SAVE)
    assert commands == [
        ["-t", "filter", "-D", "INPUT", "-j", "KUBE-FIREWALL"],
        ["-t", "nat", "-D", "PREROUTING", "-m", "comment", "--comment", "kubernetes service portals",
         "-j", "KUBE-SERVICES"],
        ["-t", "filter", "-F", "KUBE-FIREWALL"], ["-t", "nat", "-F", "KUBE-SERVICES"],
        ["-t", "filter", "-X", "KUBE-FIREWALL"], ["-t", "nat", "-X", "KUBE-SERVICES"],
    ]


def test_mounts_under_the_run_folder_come_off_deepest_first():
    mountinfo = "\n".join([
        "1 0 8:0 / / rw - ext4 /dev/vda rw",
        "2 1 0:5 / /state/node/run/kubelet/pods/a/volumes/x rw - tmpfs tmpfs rw",
        "3 1 0:6 / /state/node/run/containerd-state/sandboxes/s/shm rw - tmpfs shm rw",
        "4 1 0:7 / /state/node/run-other rw - tmpfs tmpfs rw",
        r"5 1 0:8 / /state/node/run/kubelet/pods/b/volumes/with\040space rw - tmpfs tmpfs rw",
        "6 1 0:9 / /state/node/run/kubelet rw - tmpfs tmpfs rw",
    ])
    points = host.mounts_under(mountinfo, Path("/state/node/run"))
    assert "/state/node/run-other" not in points and "/" not in points
    assert "/state/node/run/kubelet/pods/b/volumes/with space" in points
    assert points[-1] == "/state/node/run/kubelet" and len(points) == 4


def test_cgroups_are_removed_deepest_first(tmp_path):
    (tmp_path / "root" / "kubepods" / "besteffort" / "pod1").mkdir(parents=True)
    dirs = host.cgroup_dirs_under(tmp_path / "root")
    assert dirs[0].name == "pod1" and dirs[-1].name == "root"
    assert host.cgroup_dirs_under(tmp_path / "missing") == []


def test_an_image_key_follows_its_dockerfile_the_files_it_copies_and_its_base(tmp_path, monkeypatch):
    assert images.copy_sources("FROM x AS b\nCOPY a.txt b/ ./\nCOPY --from=b /opt /opt\nADD --chown=1 c d\n") == \
        ["a.txt", "b/", "c"]
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "m.py").write_text("one")
    (tmp_path / "src" / "__pycache__").mkdir()
    (tmp_path / "src" / "__pycache__" / "m.cpython-311.pyc").write_text("bytecode")
    dockerfile = tmp_path / "x.Dockerfile"
    dockerfile.write_text("FROM base\nCOPY src src\n")
    monkeypatch.setattr(images, "REPO", tmp_path)
    key = images.dockerfile_key(dockerfile, "base1")
    (tmp_path / "src" / "__pycache__" / "m.cpython-311.pyc").write_text("other bytecode")
    assert images.dockerfile_key(dockerfile, "base1") == key  # caches do not count
    assert images.dockerfile_key(dockerfile, "base2") != key
    (tmp_path / "src" / "m.py").write_text("two")
    assert images.dockerfile_key(dockerfile, "base1") != key


def test_every_image_is_planned_with_a_local_reference():
    planned = images.plan(Path("/nonexistent"), [])
    assert set(planned) == {"base", "pause", "webhook", "launcher", "torch", "mpi", "tensorflow", "xgboost",
                            "noshell", "bare"}
    assert all(i.ref == f"localhost/trainhook/{n}:{i.key}" and len(i.key) == 16 for n, i in planned.items())
    assert planned["webhook"].key != planned["launcher"].key
    assert images.digest("ab", "c") != images.digest("a", "bc")


@pytest.mark.parametrize("env, expected", [({"PIP_FIND_LINKS": "WHEELS"}, ["WHEELS"]),
                                           ({"PIP_FIND_LINKS": "https://example.org/wheels"}, [])])
def test_local_wheel_directories_are_found_from_pips_settings(tmp_path, env, expected, monkeypatch):
    monkeypatch.setattr(images.subprocess, "run", lambda *a, **k: type("Done", (), {"stdout": ""})())
    env = {k: v.replace("WHEELS", str(tmp_path)) for k, v in env.items()}
    assert images.local_wheel_dirs(env) == [Path(e.replace("WHEELS", str(tmp_path))) for e in expected]


@pytest.mark.parametrize("name", ["noshell", "bare"])
def test_the_shell_less_images_remove_their_programs_without_a_shell_and_check_it(tmp_path, name):
    """The Containerfile's one RUN is the exec form (the base's Python, no /bin/sh); its script, pointed at two
    stand-in bin directories, removes every shell (and for `bare` every Python) there and then finds none."""
    import json
    import subprocess
    text = images.stripped_containerfile("localhost/trainhook/base:k", images.STRIPPED[name])
    assert text.splitlines()[0] == "FROM localhost/trainhook/base:k"
    (run,) = [line for line in text.splitlines() if line.startswith("RUN ")]
    words = json.loads(run[4:])
    assert words[:3] == ["/usr/bin/python3", "-I", "-c"]
    dirs = [tmp_path / "usr-bin", tmp_path / "bin"]
    for d in dirs:
        d.mkdir()
        for program in ("sh", "dash", "bash", "python3", "python", "perl"):
            (d / program).write_text("")
            (d / program).chmod(0o755)
    script = words[3].replace(repr(images.SEARCHED), repr(":".join(map(str, dirs))))
    assert script != words[3]
    done = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    left = {p.name for d in dirs for p in d.iterdir()}
    assert left == ({"python3", "python", "perl"} if name == "noshell" else {"perl"})
    planned = images.plan(Path("/nonexistent"), [])
    assert planned["noshell"].key != planned["bare"].key
