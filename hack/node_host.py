"""What the test node changes on the host, and how it is put back: sysctls, the bridge, the firewall rules, the
pods' cgroup, and the mounts the kubelet and containerd leave. Every function here is safe to call twice and
after a crash (it checks what is there before changing it), because `down` must be.

Parsing is pure (`mounts_under`, `cgroup_dirs_under`); the rest runs `ip`, `iptables` and `sysctl`-like writes.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

CGROUP_FS = Path("/sys/fs/cgroup")


def _run(*command: str, check: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, check=check)


# ---- sysctls ------------------------------------------------------------------------------------------------

def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def read_sysctls(names) -> dict[str, str]:
    out = {}
    for name in names:
        try:
            out[name] = _sysctl_path(name).read_text().strip()
        except OSError:
            pass
    return out


def write_sysctls(values: dict[str, str]) -> None:
    for name, value in values.items():
        try:
            _sysctl_path(name).write_text(value)
        except OSError:
            pass


def save_sysctls(names, saved_file: Path) -> None:
    """Record the values before the node changes them; an existing record (from a run that crashed before
    `down` restored it) is the original and is kept."""
    if not saved_file.exists():
        saved_file.parent.mkdir(parents=True, exist_ok=True)
        saved_file.write_text(json.dumps(read_sysctls(names), indent=1))


def restore_sysctls(saved_file: Path) -> None:
    try:
        values = json.loads(saved_file.read_text())
    except (OSError, ValueError):
        return
    write_sysctls(values)
    saved_file.unlink(missing_ok=True)


# ---- the bridge and the firewall -----------------------------------------------------------------------------

def ensure_bridge(name: str, address_cidr: str) -> None:
    if _run("ip", "link", "show", name).returncode != 0:
        _run("ip", "link", "add", name, "type", "bridge", check=True)
    if address_cidr.split("/")[0] not in _run("ip", "-4", "addr", "show", "dev", name).stdout:
        _run("ip", "addr", "add", address_cidr, "dev", name, check=True)
    _run("ip", "link", "set", name, "up", check=True)


def delete_bridge(name: str) -> None:
    if _run("ip", "link", "show", name).returncode == 0:
        _run("ip", "link", "del", name)


def add_rules(rules: list[list[str]]) -> None:
    """Append each rule (`-t TABLE CHAIN match...`) unless it is there already."""
    for rule in rules:
        table, chain, match = rule[:2], rule[2], rule[3:]
        if _run("iptables", "-w", *table, "-C", chain, *match).returncode != 0:
            _run("iptables", "-w", *table, "-A", chain, *match, check=True)


def delete_rules(rules: list[list[str]]) -> None:
    for rule in rules:
        table, chain, match = rule[:2], rule[2], rule[3:]
        for _ in range(20):  # every copy, should an earlier run have added one twice
            if _run("iptables", "-w", *table, "-D", chain, *match).returncode != 0:
                break


def kube_chain_cleanup(iptables_save: str, prefix: str = "KUBE-") -> list[list[str]]:
    """The iptables commands that remove the chains the kubelet and kube-proxy create (KUBE-FIREWALL,
    KUBE-SERVICES, KUBE-MARK-MASQ, the canaries...), from `iptables-save` text: first every rule of another chain
    that jumps into one, then each chain's flush, then its deletion. Nothing else here creates KUBE-* chains (no
    other kubelet runs on these machines)."""
    commands: list[list[str]] = []
    chains: list[tuple[str, str]] = []
    table = ""
    for line in iptables_save.splitlines():
        if line.startswith("*"):
            table = line[1:].strip()
        elif line.startswith(":") and line[1:].startswith(prefix):
            chains.append((table, line[1:].split()[0]))
        elif line.startswith("-A "):
            words = shlex.split(line)  # iptables-save quotes comments as a shell would
            chain = words[1]
            target = words[words.index("-j") + 1] if "-j" in words else ""
            if not chain.startswith(prefix) and target.startswith(prefix):
                commands.append(["-t", table, "-D", chain, *words[2:]])
    commands += [["-t", t, "-F", c] for t, c in chains]
    commands += [["-t", t, "-X", c] for t, c in chains]
    return commands


def delete_kube_chains() -> int:
    commands = kube_chain_cleanup(_run("iptables-save").stdout)
    for command in commands:
        _run("iptables", "-w", *command)
    return len(commands)


# ---- cgroups ----------------------------------------------------------------------------------------------------

def hierarchies(root: Path = CGROUP_FS) -> list[Path]:
    """Every mounted cgroup v1 hierarchy (cpu, memory, ..., the named systemd one); symlinks (cpu,cpuacct) once."""
    try:
        return sorted({p.resolve() for p in root.iterdir() if p.is_dir()})
    except OSError:
        return []


def ensure_cgroup(relative: str) -> None:
    """Create `relative` in every hierarchy (the kubelet refuses a cgroupRoot that does not exist); cpuset needs
    its cpus and mems copied from the parent before anything can join it."""
    for h in hierarchies():
        path = h / relative.strip("/")
        try:
            path.mkdir(exist_ok=True)
            for knob in ("cpuset.cpus", "cpuset.mems"):
                if (path / knob).exists() and not (path / knob).read_text().strip():
                    (path / knob).write_text((h / knob).read_text())
        except OSError:
            pass


def cgroup_dirs_under(root: Path) -> list[Path]:
    """Every cgroup directory at or below `root`, deepest first (the order rmdir needs)."""
    if not root.is_dir():
        return []
    dirs = [root, *(p for p in root.rglob("*") if p.is_dir())]
    return sorted(dirs, key=lambda p: len(p.parts), reverse=True)


def pids_in_cgroup(relative: str) -> set[int]:
    pids: set[int] = set()
    for h in hierarchies():
        for d in cgroup_dirs_under(h / relative.strip("/")):
            try:
                pids |= {int(x) for x in (d / "cgroup.procs").read_text().split()}
            except (OSError, ValueError):
                pass
    return pids


def kill_cgroup(relative: str, timeout: float = 10.0) -> int:
    """SIGKILL every process left in the pods' cgroup (after a crash: containers whose shim is gone), then
    remove the cgroup in every hierarchy. Returns how many processes were killed."""
    killed = 0
    deadline = time.monotonic() + timeout
    while (pids := pids_in_cgroup(relative)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        time.sleep(0.2)
    for h in hierarchies():
        for d in cgroup_dirs_under(h / relative.strip("/")):
            try:
                d.rmdir()
            except OSError:
                pass
    return killed


# ---- mounts -------------------------------------------------------------------------------------------------

def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal."""
    return field.encode().decode("unicode_escape") if "\\" in field else field


def mounts_under(mountinfo: str, root: Path) -> list[str]:
    """Mount points at or below `root` in /proc/self/mountinfo text, deepest (and latest) first."""
    prefix = str(root).rstrip("/")
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        point = _unescape(fields[4])
        if point == prefix or point.startswith(prefix + "/"):
            found.append(point)
    ordered = list(reversed(found))  # later mounts over earlier ones come off first
    return sorted(dict.fromkeys(ordered), key=lambda p: p.count("/"), reverse=True)


def unmount_under(root: Path) -> list[str]:
    """Unmount everything at or below `root` (kubelet volumes, sandbox /dev/shm, network namespaces, container
    root filesystems); lazily when busy. Returns what was unmounted."""
    done = []
    for _ in range(3):  # stacked mounts show up again once the top one is gone
        points = mounts_under(Path("/proc/self/mountinfo").read_text(), root)
        if not points:
            break
        for point in points:
            if _run("umount", point).returncode == 0 or _run("umount", "-l", point).returncode == 0:
                done.append(point)
    return done


# ---- containerd's containers and shims ------------------------------------------------------------------------

def ctr(paths, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ctr", "--address", str(paths.containerd_socket), "--namespace", "k8s.io", *args],
                          capture_output=True, text=True, check=check)


def remove_containers(paths) -> int:
    """Kill and delete every container in containerd's k8s.io namespace (pods left by a crash, or at `down`)."""
    ids = ctr(paths, "containers", "ls", "-q", check=False).stdout.split()
    for cid in ids:
        ctr(paths, "tasks", "delete", "--force", cid, check=False)  # kills the process first
        ctr(paths, "containers", "delete", cid, check=False)
    return len(ids)


def stop_shims(containerd_socket: Path, stop_pid) -> None:
    """containerd-shim-runc-v2 processes outlive containerd; ours name our socket in their command line, and
    `stop_pid` (hack/processes.py's) signals a PID only while its command line still names it."""
    marker = str(containerd_socket)
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            stop_pid(int(proc.name), marker, grace=2)
