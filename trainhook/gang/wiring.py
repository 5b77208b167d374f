"""The pure pieces of a gang's wiring that the webhook injects and the launcher recomputes at run time:
MPI's variables, hostfile and roles, and TensorFlow's TF_CONFIG (the gang's shape is trainhook/gang/shape.py).

One copy, here, in the gang model: the launcher is delivered into the user's image and runs on its Python with the
standard library only (deliver.py), so it cannot import the webhook; the webhook and the launcher both import these
from here (trainhook.webhook.admission.member, .frameworks.mpi and .tensorflow re-export them), so both sides always
agree on formats and roles. It imports nothing but the standard library and the gang model (trainhook.gang.keys,
trainhook.gang.shape).

Kubeflow's references for the values: docs/use/frameworks/mpi.md and docs/use/frameworks/tensorflow.md, and the
docstrings of webhook/admission/frameworks/mpi.py and tensorflow.py.
"""

from __future__ import annotations

import json
from typing import Mapping, Sequence

# trainhook's own, read by `trainhook-launch mpirun` / `mpi-worker`: defined in trainhook/gang/keys.py, re-exported
# here.
from trainhook.gang.keys import TH_MPI_IMPLEMENTATION, TH_MPI_SLOTS
# The shape's home is trainhook/gang/shape.py; re-exported here for the MPI and TensorFlow wiring below.
from trainhook.gang.shape import Shape


# --- MPI ------------------------------------------------------------------------------------------------------

LAUNCHER, WORKER = "launcher", "worker"
OPENMPI, INTEL, MPICH = "OpenMPI", "Intel", "MPICH"
IMPLEMENTATIONS = (OPENMPI, INTEL, MPICH)

# Kubeflow's /etc/mpi: the volume name, its mount path and the two files the launcher writes there.
CONFIG_VOLUME = "mpi-job-config"
CONFIG_MOUNT_PATH = "/etc/mpi"
HOSTFILE_PATH = f"{CONFIG_MOUNT_PATH}/hostfile"
AGENT_PATH = f"{CONFIG_MOUNT_PATH}/kubexec.sh"

# mpi-operator v2: the pod's MPI role, on launchers and workers.
K_MPI_JOB_ROLE = "K_MPI_JOB_ROLE"
# OpenMPI (read by mpirun/orterun as MCA parameters).
OMPI_KEEP_FQDN = "OMPI_MCA_orte_keep_fqdn_hostnames"
OMPI_HOSTFILE = "OMPI_MCA_orte_default_hostfile"
OMPI_RSH_AGENT = "OMPI_MCA_plm_rsh_agent"
OMPI_DEFAULT_SLOTS = "OMPI_MCA_orte_set_default_slots"
# Intel MPI (read by Intel's mpiexec.hydra).
I_MPI_HOST_FILE = "I_MPI_HYDRA_HOST_FILE"
I_MPI_BOOTSTRAP = "I_MPI_HYDRA_BOOTSTRAP"
I_MPI_BOOTSTRAP_EXEC = "I_MPI_HYDRA_BOOTSTRAP_EXEC"
I_MPI_PERHOST = "I_MPI_PERHOST"
# MPICH (read by MPICH's mpiexec, Hydra).
HYDRA_HOST_FILE = "HYDRA_HOST_FILE"
HYDRA_LAUNCHER = "HYDRA_LAUNCHER"
HYDRA_LAUNCHER_EXEC = "HYDRA_LAUNCHER_EXEC"
# Set empty on a launcher without GPUs, so a node runtime that exposes every GPU by default gives it none.
NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
NVIDIA_DRIVER_CAPABILITIES = "NVIDIA_DRIVER_CAPABILITIES"


# Per implementation: (hostfile variable, agent variable, slots variable or "") as the launcher reads them.
FILE_VARIABLES: dict[str, tuple[str, str, str]] = {
    OPENMPI: (OMPI_HOSTFILE, OMPI_RSH_AGENT, OMPI_DEFAULT_SLOTS),
    INTEL: (I_MPI_HOST_FILE, I_MPI_BOOTSTRAP_EXEC, I_MPI_PERHOST),
    MPICH: (HYDRA_HOST_FILE, HYDRA_LAUNCHER_EXEC, ""),
}


def is_launcher(role: str, index: int, shape: Shape) -> bool:
    """The pod that runs mpirun: the launcher, or worker 0 in a gang without a launcher role."""
    if role == LAUNCHER:
        return True
    return role == WORKER and index == 0 and shape.count(LAUNCHER) == 0


def launcher_is_worker(shape: Shape) -> bool:
    return shape.count(LAUNCHER) == 0


def hostfile_line(address: str, slots: int, implementation: str) -> str:
    """One host: OpenMPI's `host slots=N`; Intel's and MPICH's `host:N` (MPICH refuses `slots=`)."""
    return f"{address} slots={slots}" if implementation == OPENMPI else f"{address}:{slots}"


def hostfile(hosts: Sequence[tuple[str, int]], implementation: str) -> str:
    """The hostfile for (address, slots) pairs, in the order given (the worker index order)."""
    return "".join(hostfile_line(address, slots, implementation) + "\n" for address, slots in hosts)


def launcher_env(implementation: str, slots: int, gpus: int) -> list[tuple[str, str]]:
    """The MPI launcher's variables for one implementation, in Kubeflow's order."""
    env = [(K_MPI_JOB_ROLE, LAUNCHER)]
    if implementation == OPENMPI:
        env += [(OMPI_KEEP_FQDN, "true"), (OMPI_HOSTFILE, HOSTFILE_PATH), (OMPI_RSH_AGENT, AGENT_PATH),
                (OMPI_DEFAULT_SLOTS, str(slots))]
    elif implementation == INTEL:
        env += [(I_MPI_HOST_FILE, HOSTFILE_PATH), (I_MPI_BOOTSTRAP, "rsh"), (I_MPI_BOOTSTRAP_EXEC, AGENT_PATH),
                (I_MPI_PERHOST, str(slots))]
    else:
        env += [(HYDRA_HOST_FILE, HOSTFILE_PATH), (HYDRA_LAUNCHER, "rsh"), (HYDRA_LAUNCHER_EXEC, AGENT_PATH)]
    if gpus == 0:
        env += [(NVIDIA_VISIBLE_DEVICES, ""), (NVIDIA_DRIVER_CAPABILITIES, "")]
    return env + [(TH_MPI_IMPLEMENTATION, implementation), (TH_MPI_SLOTS, str(slots))]


# --- TensorFlow -----------------------------------------------------------------------------------------------

# Set by the webhook on the training container of every pod of a tensorflow gang of two or more pods; read by
# TensorFlow's TFConfigClusterResolver (and by code written for a Kubeflow TFJob).
TF_CONFIG = "TF_CONFIG"
# Kubeflow sets it so that TensorFlow <= 1.3's tf.contrib.learn does not assume a local run; kept for parity.
TF_ENVIRONMENT = "cloud"


def cluster_spec(addresses: Mapping[str, Sequence[str]], port: int) -> dict[str, list[str]]:
    """The `cluster` of TF_CONFIG: role -> [`address:port`, ...], roles sorted by name (Go's map order)."""
    return {role: [f"{address}:{port}" for address in addresses[role]] for role in sorted(addresses)}


def tf_config(cluster: Mapping[str, Sequence[str]], task_type: str, index: int) -> str:
    """TF_CONFIG as Kubeflow's controller serializes it: compact JSON, fields in its struct order."""
    config = {"cluster": {role: list(cluster[role]) for role in cluster},
              "task": {"type": task_type, "index": index},
              "environment": TF_ENVIRONMENT}
    return json.dumps(config, separators=(",", ":"))
