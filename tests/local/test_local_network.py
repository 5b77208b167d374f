"""trainhook local: one network namespace per pod on a private bridge (real namespaces; needs root)."""

from __future__ import annotations

import errno
import subprocess
import threading

import pytest

from trainhook.local.envvars import base_env
from trainhook.local.network import HostEntry, Network, hosts_file, list_run_namespaces
from trainhook.local.pods import ContainerSpec, LocalPod, exec_in_pod

SERVER = ("import socket; s = socket.create_server(('0.0.0.0', 7000)); print('listening', flush=True); "
          "c, _ = s.accept(); c.sendall(socket.gethostname().encode()); c.close()")
CLIENT = ("import socket, sys, time\n"
          "for _ in range(100):\n"
          "    try: c = socket.create_connection((sys.argv[1], 7000), timeout=2); break\n"
          "    except OSError: time.sleep(0.1)\n"
          "print(c.recv(100).decode())")


@pytest.fixture
def network():
    net = Network()
    net.open()
    try:
        yield net
    finally:
        assert net.close() == []
        assert list_run_namespaces(net.run_id) == []


def gang(network, tmp_path, names, subdomain="gang"):
    """Pods on the network with hosts files naming every pod, ready for exec_in_pod."""
    nets = {name: network.add_pod() for name in names}
    entries = [HostEntry(nets[n].ip, n, subdomain, "default") for n in names]
    pods = {}
    for name, entry in zip(names, entries):
        hosts = tmp_path / f"{name}.hosts"
        hosts.write_text(hosts_file(entry, entries))
        spec = ContainerSpec("c", "main", ["true"], base_env(name), training=True)
        pods[name] = LocalPod(name, "default", name, nets[name].ip, nets[name].netns_path, str(hosts), [], [spec])
    return pods


def run_in(pod, *command, timeout=30):
    proc = exec_in_pod(pod, list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def test_pods_reach_each_other_by_name_and_each_binds_the_same_port(network, tmp_path):
    pods = gang(network, tmp_path, ["a", "b", "c"])
    servers = {n: exec_in_pod(pods[n], ["python", "-c", SERVER], stdout=subprocess.PIPE, text=True)
               for n in ("b", "c")}
    try:
        for name, server in servers.items():
            assert server.stdout.readline().strip() == "listening"
        code, out = run_in(pods["a"], "python", "-c", CLIENT, "b.gang")
        assert (code, out.strip()) == (0, "b")
        code, out = run_in(pods["a"], "python", "-c", CLIENT, "c.gang.default.svc.cluster.local")
        assert (code, out.strip()) == (0, "c")
    finally:
        for server in servers.values():
            server.kill()
            server.wait()


GATEWAY_CLIENT = ("import socket, sys\n"
                  "try:\n"
                  "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close(); print('reached')\n"
                  "except OSError as e:\n"
                  "    print('not reached:', e)")


def set_port_mac(network, index: int, mac: str) -> None:
    subprocess.run(["ip", "-n", network.switch, "link", "set", f"v{index}", "address", mac], check=True)


def bridge_mac(network) -> str:
    out = subprocess.run(["ip", "-n", network.switch, "link", "show", "br0"], capture_output=True, text=True,
                         check=True).stdout
    return out.split("link/ether ")[1].split()[0]


def test_a_pod_added_later_leaves_the_gateway_where_the_others_cached_it(network, tmp_path):
    """A bridge left to pick its MAC takes its ports' lowest: a pod added later (a scale-up, a deleted pod made
    again) with a lower one moved it, and a pod that had cached the old one lost the gateway, and the notary
    behind it, until its ARP entry expired (test_deleted_member_local failed so, 1 run in 3). Here the second
    port's MAC is made the lowest before pod a caches the gateway, and a third, lower still, comes after."""
    listener = network.listen_on_switch(7001)
    accepting = threading.Thread(target=lambda: [listener.accept()[0].close() for _ in range(2)], daemon=True)
    accepting.start()
    try:
        pods = gang(network, tmp_path, ["a", "b"])
        set_port_mac(network, 1, "02:00:00:00:00:02")
        before = bridge_mac(network)
        assert run_in(pods["a"], "python", "-c", GATEWAY_CLIENT, network.gateway, "7001")[1].strip() == "reached"
        network.add_pod()
        set_port_mac(network, 2, "02:00:00:00:00:01")
        assert run_in(pods["a"], "python", "-c", GATEWAY_CLIENT, network.gateway, "7001")[1].strip() == "reached"
        assert bridge_mac(network) == before == network.bridge_mac
    finally:
        listener.close()


def test_every_spelling_of_a_peer_resolves_to_its_ip(network, tmp_path):
    pods = gang(network, tmp_path, ["a", "b"])
    names = ["b.gang", "b.gang.default", "b.gang.default.svc", "b.gang.default.svc.cluster.local", "a", "localhost"]
    code, out = run_in(pods["a"], "python", "-c",
                       "import socket, sys; print(' '.join(socket.gethostbyname(n) for n in sys.argv[1:]))", *names)
    assert code == 0, out
    assert out.split() == [pods["b"].ip] * 4 + [pods["a"].ip, "127.0.0.1"]


def test_a_pod_has_its_own_hostname_and_only_the_private_subnet(network, tmp_path):
    pods = gang(network, tmp_path, ["trainer-0"])
    code, out = run_in(pods["trainer-0"], "sh", "-c", "hostname; ip -4 -o addr show eth0; ip route")
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0] == "trainer-0"
    assert f"inet {pods['trainer-0'].ip}/24" in lines[1]
    assert [line for line in lines[2:] if "default" in line] == []  # nothing routes out
    code, out = run_in(pods["trainer-0"], "python", "-c",
                       "import socket\ntry: socket.create_connection(('1.1.1.1', 53), timeout=2)\n"
                       "except OSError as e: print(e.errno)")
    assert out.strip() == str(errno.ENETUNREACH)


def test_the_host_keeps_its_hosts_file_and_hostname(network, tmp_path):
    before = (open("/etc/hosts").read(), subprocess.run(["hostname"], capture_output=True, text=True).stdout)
    pods = gang(network, tmp_path, ["a"])
    assert run_in(pods["a"], "hostname")[1].strip() == "a"
    after = (open("/etc/hosts").read(), subprocess.run(["hostname"], capture_output=True, text=True).stdout)
    assert after == before


def test_parallel_runs_have_their_own_namespaces_and_clean_up():
    first, second = Network(), Network()
    first.open()
    try:
        second.open()
        try:
            first.add_pod(), second.add_pod()
            assert first.switch != second.switch
            assert len(list_run_namespaces(first.run_id)) == 2
            assert set(list_run_namespaces(first.run_id)).isdisjoint(list_run_namespaces(second.run_id))
            assert all(len(name) <= 15 for name in first.namespaces() + second.namespaces())
        finally:
            second.close()
        assert list_run_namespaces(second.run_id) == []
        assert len(list_run_namespaces(first.run_id)) == 2
    finally:
        first.close()
        assert first.close() == []  # twice is fine
    assert list_run_namespaces(first.run_id) == []


def test_hosts_file_is_the_kubelets_plus_the_peers():
    own = HostEntry("10.244.1.2", "ddp-0", "ddp", "ml")
    peer = HostEntry("10.244.1.3", "ddp-1", "ddp", "ml")
    text = hosts_file(own, [own, peer], "cluster.local", {"ddp": ["10.244.1.2", "10.244.1.3"]})
    lines = text.splitlines()
    assert lines[0] == "# Kubernetes-managed hosts file."
    assert "127.0.0.1\tlocalhost" in lines
    assert "10.244.1.2\tddp-0.ddp.ml.svc.cluster.local\tddp-0" in lines
    assert "10.244.1.3\tddp-1.ddp.ml.svc.cluster.local ddp-1.ddp.ml.svc ddp-1.ddp.ml ddp-1.ddp" in lines
    assert lines[-2:] == ["10.244.1.2\tddp", "10.244.1.3\tddp"]
