"""Real MPI across `trainhook local` pods: every pod in its own network namespace, the real webhook, OpenMPI
(Debian's openmpi-bin) and MPICH (Debian's mpich) with mpi4py, mpirun's daemons started in the worker pods
through the rsh agent: the default `gang` transport (each worker's own mpi-worker spawns the daemon, asked over
the gang's authenticated port: no exec API, no sshd), the `local` transport (the runner's `kubectl exec`), or
ssh to a real sshd.

mpi4py's wheel carries both ABIs and, unless MPI4PY_MPIABI says which, takes whatever `libmpi.so` is; the
launcher sets it from the gang's implementation. Debian names MPICH's library libmpich.so.12 where upstream
MPICH (and mpi4py's MPICH build) expects libmpi.so.12, so the MPICH runs put a `libmpi.so.12 -> libmpich.so.12`
link on LD_LIBRARY_PATH, which is what an image with upstream MPICH has anyway.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from helpers import local_summary

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "mpi"
LOOP = '''\
import socket
import time

from mpi4py import MPI

comm = MPI.COMM_WORLD
for step in range(1200):
    comm.allreduce(1)
    if comm.Get_rank() == 0 and step % 10 == 0:
        print(f"step {step}", flush=True)
    time.sleep(0.05)
'''


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def write(docs: list[dict], path: Path) -> Path:
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


def command(manifest: Path, run_dir: Path, timeout: float) -> list[str]:
    return [sys.executable, "-m", "trainhook.local.cli", str(manifest), "--timeout", str(timeout),
            "--workdir", str(run_dir), "--grace-period", "5"]


def local(manifest: Path, tmp_path: Path, timeout: float = 120) -> tuple[subprocess.CompletedProcess, Path]:
    run_dir = tmp_path / "run"
    done = subprocess.run(command(manifest, run_dir, timeout), capture_output=True, text=True,
                          timeout=timeout + 60, cwd=ROOT)
    return done, run_dir


def exit_codes(stdout: str) -> dict[str, int]:
    """POD -> EXIT from `trainhook local`'s summary table."""
    codes = {}
    for row in stdout[stdout.index("POD  "):].splitlines()[1:]:
        if row.startswith("run "):
            return codes
        codes[row.split()[0]] = int(row.split()[2])
    raise AssertionError(f"no summary table in:\n{stdout}")


def log(run_dir: Path, pod_prefix: str, container: str = "mpi") -> str:
    matches = sorted((run_dir / "logs").glob(f"{pod_prefix}*/{container}.log"))
    assert matches, f"no log for {pod_prefix}/{container} in {run_dir}"
    return matches[0].read_text()


def containers(docs: list[dict]):
    for doc in docs:
        if doc["kind"] in ("Job", "StatefulSet"):
            yield doc, doc["spec"]["template"]["spec"]["containers"][0]


def mpich_shim(tmp_path: Path, *names: str) -> Path:
    """A folder where each of NAMES is MPICH's library (default: upstream MPICH's soname libmpi.so.12)."""
    libraries = sorted(Path("/usr/lib").glob("*/libmpich.so.12")) + sorted(Path("/usr/lib").glob("libmpich.so.12"))
    if not libraries:
        pytest.fail("MPICH is not installed (apt-get install mpich)")
    shim = tmp_path / "mpich-abi"
    shim.mkdir()
    for name in names or ("libmpi.so.12",):
        (shim / name).symlink_to(libraries[0])
    return shim


def as_statefulset(job: dict) -> dict:
    """The same single-role gang as one StatefulSet (Kubeflow's runLauncherAsWorker shape as a StatefulSet)."""
    name = job["metadata"]["name"]
    template = copy.deepcopy(job["spec"]["template"])
    template["spec"].pop("restartPolicy", None)
    template["metadata"]["labels"]["app"] = name
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": job["metadata"],
            "spec": {"serviceName": name, "replicas": job["spec"]["completions"],
                     "selector": {"matchLabels": {"app": name}}, "template": template}}


def test_openmpi_allreduce_across_three_job_pods_where_pod_0_launches(tmp_path):
    done, run_dir = local(EXAMPLES / "allreduce.yaml", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    codes = exit_codes(done.stdout)
    assert len(codes) == 3 and set(codes.values()) == {0}
    launcher = log(run_dir, "allreduce-0")
    assert "OpenMPI, gang transport" in launcher  # the default: the workers' own mpi-worker starts the daemons
    assert "allreduce over 3 ranks on 3 hosts (allreduce-0, allreduce-1, allreduce-2): sum=6 expected=6" in launcher
    assert "mpi library: Open MPI v4" in launcher
    assert ("running: mpirun.openmpi --allow-run-as-root -x MPI4PY_MPIABI -np 3 python /workspace/allreduce.py"
            in launcher)
    hostfile = next((run_dir / "pods").glob("allreduce-0-*")) / "volumes" / "mpi-job-config" / "hostfile"
    assert hostfile.read_text() == ("allreduce-0.allreduce slots=1\nallreduce-1.allreduce slots=1\n"
                                    "allreduce-2.allreduce slots=1\n")
    for worker in ("allreduce-1", "allreduce-2"):
        text = log(run_dir, worker)
        assert "not the launcher: serving as a worker" in text
        assert "launcher finished: mpirun.openmpi exited with 0; exiting 0" in text
    # The agent never held the key: it was handed a connection through the launcher's private doorway.
    agent = (hostfile.parent / "kubexec.sh").read_text()
    assert "kubexec --transport gang --doorway /etc/mpi/.trainhook-doorway/doorway.sock" in agent


def test_the_local_transport_stays_selectable(tmp_path):
    docs = documents(EXAMPLES / "allreduce.yaml")
    for _, c in containers(docs):
        c.setdefault("env", []).append({"name": "TRAINHOOK_MPI_TRANSPORT", "value": "local"})
    done, run_dir = local(write(docs, tmp_path / "allreduce-local.yaml"), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    launcher = log(run_dir, "allreduce-0")
    assert "OpenMPI, local transport" in launcher  # its run directory found from the pod's /etc/hosts mount
    assert "allreduce over 3 ranks on 3 hosts (allreduce-0, allreduce-1, allreduce-2): sum=6 expected=6" in launcher


def test_openmpi_data_parallel_sgd_with_a_launcher_and_two_workers_of_two_slots(tmp_path):
    done, run_dir = local(EXAMPLES / "sgd.yaml", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    codes = exit_codes(done.stdout)
    assert sorted(codes.values()) == [0, 0, 0] and len(codes) == 3
    launcher = log(run_dir, "sgd-launcher-0")
    # The MPIJob's own mpirun line ran, with --allow-run-as-root and the ABI pin added; the ranks ran in the
    # workers only.
    assert ("running: mpirun --allow-run-as-root -x MPI4PY_MPIABI -np 4 -bind-to none -map-by slot "
            "python /workspace/sgd.py") in launcher
    assert "training on 4 ranks (sgd-worker-0: 2, sgd-worker-1: 2)" in launcher
    assert re.search(r"final weights digest [0-9a-f]{16} identical-across-ranks=True", launcher)
    losses = [float(x) for x in re.findall(r"epoch \d+ loss ([0-9.]+)", launcher)]
    assert len(losses) == 5 and losses[-1] < losses[0] / 100
    launcher_pod = next((run_dir / "pods").glob("sgd-launcher-0-*"))
    hostfile = (launcher_pod / "volumes" / "mpi-job-config" / "hostfile").read_text()
    assert hostfile == "sgd-worker-0.sgd slots=2\nsgd-worker-1.sgd slots=2\n"
    for worker_pod in (run_dir / "pods").glob("sgd-worker-*"):
        agent = (worker_pod / "volumes" / "mpi-job-config" / "kubexec.sh").read_text()
        assert "kubexec --transport gang --doorway" in agent  # installed for OpenMPI's orted check


def test_mpich_allreduce_on_one_statefulset_through_hydra_with_its_own_hostfile_format(tmp_path):
    docs = [as_statefulset(d) if d["kind"] == "Job" else d for d in documents(EXAMPLES / "allreduce.yaml")]
    shim = mpich_shim(tmp_path)
    for workload, c in containers(docs):
        workload["metadata"].setdefault("annotations", {})["trainhook.dev/mpi-implementation"] = "MPICH"
        c["env"] = [{"name": "LD_LIBRARY_PATH", "value": str(shim)}]  # upstream MPICH's soname, as in its images
    done, run_dir = local(write(docs, tmp_path / "allreduce-mpich.yaml"), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert exit_codes(done.stdout) == {"allreduce-0": 0, "allreduce-1": 0, "allreduce-2": 0}
    # A StatefulSet's pods would rerun the training: every member parks once mpirun is done, as `run`'s do.
    assert {pod: row[3] for pod, row in local_summary(done.stdout).items()} == {
        "allreduce-0": "Succeeded", "allreduce-1": "Succeeded", "allreduce-2": "Succeeded"}
    launcher = log(run_dir, "allreduce-0")
    # Hydra's proxies dial the launcher back by the name -localhost gives (its own hostname would not resolve).
    assert ("running: mpiexec.mpich -localhost allreduce-0.allreduce -n 3 python /workspace/allreduce.py"
            in launcher)
    assert "allreduce over 3 ranks on 3 hosts (allreduce-0, allreduce-1, allreduce-2): sum=6 expected=6" in launcher
    assert "mpi library: MPICH Version:" in launcher
    assert "MPICH, gang transport" in launcher  # Hydra's proxies started by the workers' own mpi-worker
    hostfile = run_dir / "pods" / "allreduce-0" / "volumes" / "mpi-job-config" / "hostfile"
    assert hostfile.read_text() == "allreduce-0.allreduce:1\nallreduce-1.allreduce:1\nallreduce-2.allreduce:1\n"


def test_an_openmpi_gang_runs_open_mpi_where_libmpi_so_is_mpichs(tmp_path):
    """Debian's mpich pulls in libmpich-dev, whose libmpi.so is MPICH's: with both MPIs in an image (or on this
    machine), mpi4py would take MPICH's library and fail under Open MPI's mpirun. The launcher pins the ranks
    to the implementation the gang names; here libmpi.so on the ranks' library path is MPICH's."""
    docs = documents(EXAMPLES / "allreduce.yaml")
    shim = mpich_shim(tmp_path, "libmpi.so", "libmpi.so.12")
    for _, c in containers(docs):
        c["env"] = [{"name": "LD_LIBRARY_PATH", "value": str(shim)}]
    done, run_dir = local(write(docs, tmp_path / "allreduce-both.yaml"), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    launcher = log(run_dir, "allreduce-0")
    assert "mpi library: Open MPI v4" in launcher
    assert "allreduce over 3 ranks on 3 hosts (allreduce-0, allreduce-1, allreduce-2): sum=6 expected=6" in launcher


def test_the_ssh_transport_with_keys_from_a_secret_and_sshd_in_the_workers(tmp_path):
    """mpi-operator v2's way, for real: Debian's sshd in each worker pod, keys generated here into a Secret
    mounted at /root/.ssh (its items as mpi-operator names them), the launcher's agent running ssh."""
    key = tmp_path / "id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "trainhook-test", "-f", str(key)], check=True)
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "sgd-ssh"}, "type": "kubernetes.io/ssh-auth",
              "data": {"ssh-privatekey": base64.b64encode(key.read_bytes()).decode(),
                       "ssh-publickey": base64.b64encode(key.with_suffix(".pub").read_bytes()).decode()}}
    volume = {"name": "ssh-auth", "secret": {"secretName": "sgd-ssh", "defaultMode": 0o600, "items": [
        {"key": "ssh-privatekey", "path": "id_rsa"}, {"key": "ssh-publickey", "path": "id_rsa.pub"},
        {"key": "ssh-publickey", "path": "authorized_keys"}]}}
    docs = documents(EXAMPLES / "sgd.yaml") + [secret]
    for workload, c in containers(docs):
        workload["spec"]["template"]["spec"]["volumes"].append(volume)
        c["volumeMounts"].append({"name": "ssh-auth", "mountPath": "/root/.ssh"})
        if workload["metadata"]["name"] == "sgd-worker":
            # mpi-operator v2's worker command; the webhook runs it beside `trainhook-launch mpi-worker`. A
            # Secret volume's directory is world-writable (1777, as on a kubelet), which sshd's StrictModes
            # refuses: mpi-operator's images say `StrictModes no` in sshd_config; this host's sshd is told here.
            c["command"] = ["sh", "-c", "mkdir -p /run/sshd && exec /usr/sbin/sshd -De -o StrictModes=no"]
        else:
            c["env"].append({"name": "TRAINHOOK_MPI_TRANSPORT", "value": "ssh"})
            # sshd gives its sessions the system PATH; the ranks need this Python's (an image's would be there).
            c["command"] = c["command"][:1] + ["-x", "PATH"] + c["command"][1:]
    done, run_dir = local(write(docs, tmp_path / "sgd-ssh.yaml"), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    launcher = log(run_dir, "sgd-launcher-0")
    assert "OpenMPI, ssh transport" in launcher
    assert "training on 4 ranks (sgd-worker-0: 2, sgd-worker-1: 2)" in launcher
    assert "identical-across-ranks=True" in launcher
    for worker in ("sgd-worker-0", "sgd-worker-1"):
        text = log(run_dir, worker)
        assert "started sh -c mkdir -p /run/sshd && exec /usr/sbin/sshd -De -o StrictModes=no" in text
        assert "Accepted publickey for root" in text  # the daemons really came in over ssh
        assert "launcher finished: mpirun exited with 0; exiting 0" in text


# --- Failures -------------------------------------------------------------------------------------------------

def loop_gang(tmp_path: Path) -> Path:
    """The sgd gang's shape (a launcher, 2 workers of one slot) running a long allreduce loop."""
    docs = documents(EXAMPLES / "sgd.yaml")
    for doc in docs:
        if doc["kind"] == "ConfigMap":
            doc["data"] = {"loop.py": LOOP}
    for workload, c in containers(docs):
        workload["metadata"]["annotations"]["trainhook.dev/slots-per-worker"] = "1"
        if workload["metadata"]["name"] == "sgd-launcher":
            c["command"] = ["python", "/workspace/loop.py"]
    return write(docs, tmp_path / "loop.yaml")


def gone(pids: list[int]) -> bool:
    return not [pid for pid in pids if Path(f"/proc/{pid}").exists()
                and "Z" not in Path(f"/proc/{pid}/stat").read_text().split(")")[-1][:3]]


def processes_in(netns_path: str, needle: str = "") -> list[int]:
    """PIDs whose command line contains `needle` and that live in the given network namespace."""
    inode = os.stat(netns_path).st_ino
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if needle in cmdline and os.stat(entry / "ns" / "net").st_ino == inode:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def start_and_wait_for_training(manifest: Path, tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    run_dir = tmp_path / "run"
    process = subprocess.Popen(command(manifest, run_dir, 120), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, cwd=ROOT)
    deadline = time.monotonic() + 90
    while True:
        logs = list((run_dir / "logs").glob("sgd-launcher-0-*/mpi.log"))
        if logs and "step 20" in logs[0].read_text():
            return process, run_dir
        if process.poll() is not None or time.monotonic() > deadline:
            output = process.communicate()[0] if process.poll() is not None else ""
            process.kill()
            pytest.fail(f"the loop never got going:\n{output}")
        time.sleep(0.2)


def worker_netns(run_dir: Path, worker: str) -> str:
    sandbox = next((run_dir / "pods").glob(f"{worker}-*")) / "sandbox.json"
    return json.loads(sandbox.read_text())["netns_path"]


def finish(process: subprocess.Popen) -> str:
    try:
        return process.communicate(timeout=60)[0]
    finally:
        if process.poll() is None:
            process.kill()


def test_a_rank_killed_mid_run_fails_mpirun_and_every_pod_with_the_launchers_code_within_seconds(tmp_path):
    process, run_dir = start_and_wait_for_training(loop_gang(tmp_path), tmp_path)
    ranks = processes_in(worker_netns(run_dir, "sgd-worker-1"), "/workspace/loop.py")
    assert len(ranks) == 1, ranks
    everything = [pid for w in ("sgd-worker-0", "sgd-worker-1") for pid in processes_in(worker_netns(run_dir, w))]
    killed_at = time.monotonic()
    os.kill(ranks[0], signal.SIGKILL)
    output = finish(process)
    elapsed = time.monotonic() - killed_at
    codes = exit_codes(output)
    launcher_code = next(code for pod, code in codes.items() if pod.startswith("sgd-launcher"))
    assert launcher_code != 0, output
    # Every worker got the launcher's outcome over the control channel and exited with it.
    assert sorted(codes.values()) == [launcher_code] * 3, output
    for worker in ("sgd-worker-0", "sgd-worker-1"):
        assert f"exiting {launcher_code}" in log(run_dir, worker)
    assert elapsed < 20, f"the gang took {elapsed:.1f}s to end"
    assert gone(everything), "a process of a worker pod outlived the gang"


def test_a_worker_pod_killed_mid_run_ends_the_whole_gang_non_zero_within_seconds(tmp_path):
    process, run_dir = start_and_wait_for_training(loop_gang(tmp_path), tmp_path)
    main = processes_in(worker_netns(run_dir, "sgd-worker-1"), "mpi-worker")  # the container's process
    assert len(main) == 1, main
    everything = [pid for w in ("sgd-worker-0", "sgd-worker-1") for pid in processes_in(worker_netns(run_dir, w))]
    killed_at = time.monotonic()
    os.kill(main[0], signal.SIGKILL)
    output = finish(process)
    elapsed = time.monotonic() - killed_at
    codes = exit_codes(output)
    assert len(codes) == 3 and all(code != 0 for code in codes.values()), output
    assert elapsed < 20, f"the gang took {elapsed:.1f}s to end"
    assert gone(everything), "a process of a worker pod outlived the gang"


def test_a_worker_that_never_answers_is_named_at_the_launchers_deadline(tmp_path):
    docs = documents(EXAMPLES / "sgd.yaml")
    for workload, c in containers(docs):
        if workload["metadata"]["name"] == "sgd-worker":  # workers that never run mpi-worker
            workload["spec"]["template"]["metadata"]["annotations"] = {"trainhook.dev/launcher": "none"}
            c["command"] = ["sleep", "20"]  # nothing stops them: the run ends when they do
        else:
            c["env"].append({"name": "TRAINHOOK_WAIT_TIMEOUT", "value": "3"})
    started = time.monotonic()
    done, run_dir = local(write(docs, tmp_path / "no-workers.yaml"), tmp_path, timeout=60)
    codes = exit_codes(done.stdout)
    launcher_code = next(code for pod, code in codes.items() if pod.startswith("sgd-launcher"))
    assert launcher_code == 1, done.stdout
    assert time.monotonic() - started < 40
    launcher = log(run_dir, "sgd-launcher-0")
    assert re.search(r"2 of 2 worker\(s\) not reachable after \d+s \(deadline 3s\): "
                     r"rank 1 \(worker-0 at sgd-worker-0\.sgd\): connection refused \(is it running "
                     r"`trainhook-launch mpi-worker`\?\); rank 2 \(worker-1 at sgd-worker-1\.sgd\)", launcher), launcher
