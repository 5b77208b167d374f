"""MPI: Kubeflow MPIJob's launcher environment, hostfile formats and the launcher's /etc/mpi (contract section 4).

Kubeflow's references, whose variable names and values are kept (only the addresses differ, contract section 3):
- kubeflow/training-operator pkg/controller.v1/mpi/mpijob_controller.go (`newLauncher`, `newConfigMap`): the
  launcher gets OMPI_MCA_plm_rsh_agent=/etc/mpi/kubexec.sh and OMPI_MCA_orte_default_hostfile=/etc/mpi/hostfile
  (a ConfigMap mounted at /etc/mpi, volume `mpi-job-config`), and NVIDIA_VISIBLE_DEVICES="" plus
  NVIDIA_DRIVER_CAPABILITIES="" when it requests no GPU (`isGPULauncher`, pkg/controller.v1/mpi/mpijob.go);
  its kubexec.sh runs `kubectl exec $POD -- /bin/sh -c "$*"`.
- kubeflow/mpi-operator pkg/controller/mpi_job_controller.go (v2beta1; `ompiEnvVars`, `intelEnvVars`,
  `mpichEnvVars`, `newConfigMap`, `newLauncherPodTemplate`): OMPI_MCA_orte_keep_fqdn_hostnames=true,
  OMPI_MCA_orte_set_default_slots / I_MPI_PERHOST = slotsPerWorker, I_MPI_HYDRA_HOST_FILE, HYDRA_HOST_FILE,
  K_MPI_JOB_ROLE=launcher|worker, and hostfile lines `<host> slots=N` (OpenMPI) or `<host>:N` (Intel, MPICH).
  v2 reaches workers over ssh; here the launcher reaches them through an rsh agent (`trainhook-launch kubexec`,
  contract section 6: the script at AGENT_PATH, Kubeflow v1's /etc/mpi/kubexec.sh, whose default transport is
  `gang`: each worker's own mpi-worker spawns the daemons, so no pod needs `pods/exec`; see
  docs/use/frameworks/mpi.md), so Intel and MPICH also get the rsh bootstrap variables the contract names
  (I_MPI_HYDRA_BOOTSTRAP=rsh, I_MPI_HYDRA_BOOTSTRAP_EXEC, HYDRA_LAUNCHER=rsh, HYDRA_LAUNCHER_EXEC) and OpenMPI
  v1's OMPI_MCA_plm_rsh_agent. v2's ssh-only `-o ConnectionAttempts=10` variables are not injected: the agent
  passes that option to ssh itself when the transport is ssh.

Layouts. A gang with a `launcher` role (`launcher=1,worker=N`, two workloads `<job>-launcher` and `<job>-worker`)
launches from the launcher pod, which is not in the hostfile (mpi-operator's default). A gang with workers only
(one StatefulSet or Indexed Job labeled `trainhook.dev/framework: mpi` and no role) launches from worker 0, which
is also the hostfile's first host (mpi-operator's `runLauncherAsWorker`): every pod runs the same
`trainhook-launch mpirun -- CMD`, and the launcher there finds it is not worker 0's and serves as a worker.

The hostfile and the agent script are written by `trainhook-launch mpirun` at run time (the webhook creates no
objects, so there is no ConfigMap): `mutate_pod_spec` gives the training container of every MPI pod an emptyDir
at /etc/mpi. Workers need it too: OpenMPI's orted refuses to start where the plm_rsh_agent path it is handed
does not exist, so `mpi-worker` installs the same agent there (Kubeflow v1 mounts kubexec.sh in its workers for
the same reason).
The variable names, `hostfile`, `launcher_env` and `is_launcher` are pure and shared with the launcher, so both
sides agree on formats and roles: they live on the launcher's side (trainhook.gang.wiring), which runs on an
image's Python with the standard library only, and are imported here.
"""

from __future__ import annotations

from trainhook.gang import keys
from trainhook.gang.wiring import (CONFIG_MOUNT_PATH, CONFIG_VOLUME, IMPLEMENTATIONS, K_MPI_JOB_ROLE, LAUNCHER,
                                       OPENMPI, TH_MPI_SLOTS, WORKER, is_launcher, launcher_env)
from trainhook.gang.wiring import INTEL, MPICH, hostfile  # noqa: F401  (re-exported: MPI's module names them)
from trainhook.webhook.admission.member import Member, Problems, Shape

MPI_IMPLEMENTATION, SLOTS_PER_WORKER = keys.MPI_IMPLEMENTATION, keys.SLOTS_PER_WORKER


def implementation_of(member: Member, problems: Problems) -> str:
    value = member.option(MPI_IMPLEMENTATION, OPENMPI).strip()
    if value not in IMPLEMENTATIONS:
        problems.add(MPI_IMPLEMENTATION, value, "not an MPI implementation trainhook knows",
                     f"use one of {', '.join(IMPLEMENTATIONS)}")
        return OPENMPI
    return value


def slots_of(member: Member, gpus: int, problems: Problems) -> int:
    """Slots per worker: the slots-per-worker annotation, else an integer nproc-per-node, else (auto, gpu) the
    training container's GPU count, or 1 without GPUs."""
    text = member.option(SLOTS_PER_WORKER).strip()
    if text:
        if text.isdigit() and int(text) >= 1:
            return int(text)
        problems.add(SLOTS_PER_WORKER, text, "not a slot count", "use a positive integer")
        return 1
    nproc = member.option(keys.NPROC_PER_NODE, "auto").strip()
    if nproc.isdigit() and int(nproc) >= 1:
        return int(nproc)
    if nproc in ("auto", "gpu"):
        return gpus or 1
    problems.add(keys.NPROC_PER_NODE, nproc, "an MPI gang needs a slot count per worker, which "
                 f"{nproc!r} does not give at admission", f"set {SLOTS_PER_WORKER} or an integer {keys.NPROC_PER_NODE}")
    return 1


def check_shape(shape: Shape, problems: Problems) -> None:
    text = str(shape)
    if shape.count(LAUNCHER) > 1:
        problems.add(keys.REPLICAS, text, "an MPI gang has one launcher (it runs mpirun)",
                     "set launcher=1, or leave the launcher role out so that worker 0 launches")
    if shape.count(WORKER) < 1:
        problems.add(keys.REPLICAS, text, "an MPI gang needs workers (the hosts of the hostfile)",
                     "add worker=N with N >= 1")


def build_env(member: Member, gpus: int, problems: Problems) -> list[tuple[str, str]]:
    check_shape(member.shape, problems)
    implementation = implementation_of(member, problems)
    slots = slots_of(member, gpus, problems)
    if is_launcher(member.role, member.index, member.shape):
        return launcher_env(implementation, slots, gpus)
    return [(K_MPI_JOB_ROLE, WORKER), (TH_MPI_SLOTS, str(slots))]


def launcher_words(role: str, shape: Shape) -> list[str]:
    """The subcommand that wraps a member's training (frameworks.launcher_words): mpirun on the launcher (or worker
    0 of a gang without one), mpi-worker on the workers of a gang with a launcher."""
    if role == WORKER and shape.count(LAUNCHER) > 0:
        return ["mpi-worker", "--"]
    return ["mpirun", "--"]


def mutate_pod_spec(member: Member, spec: dict, container: dict, problems: Problems) -> None:
    """Give the training container a writable /etc/mpi (an emptyDir named as Kubeflow's ConfigMap volume) for
    the hostfile and the agent script. A container that already mounts something at /etc/mpi keeps it (it must
    be writable then). Idempotent."""
    mounts = container.get("volumeMounts") or []
    if any(m.get("mountPath", "").rstrip("/") == CONFIG_MOUNT_PATH for m in mounts):
        return
    volumes = spec.get("volumes") or []
    if any(v.get("name") == CONFIG_VOLUME for v in volumes):
        problems.add("spec.volumes", CONFIG_VOLUME, f"the name of the volume trainhook mounts at {CONFIG_MOUNT_PATH} "
                     "in MPI pods", f"rename your volume, or mount it at {CONFIG_MOUNT_PATH} yourself")
        return
    spec["volumes"] = volumes + [{"name": CONFIG_VOLUME, "emptyDir": {}}]
    container["volumeMounts"] = mounts + [{"name": CONFIG_VOLUME, "mountPath": CONFIG_MOUNT_PATH}]
