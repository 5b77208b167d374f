"""JAX: Kubeflow JAXJob's variables, plus the JAX_* spelling jax.distributed reads (contract section 4).

Kubeflow's reference is `setPodEnv` in kubeflow/training-operator pkg/controller.v1/jax/envvar.go (v1.9):
PYTHONUNBUFFERED=1, COORDINATOR_PORT, COORDINATOR_ADDRESS (`<job>-worker-0`), NUM_PROCESSES (all replicas) and
PROCESS_ID (the pod's index). JAXJob has the one role `worker`, so the process id is the global rank. Here the
coordinator is rank 0's address, `<host>-0.<subdomain>`.

JAX_COORDINATOR_ADDRESS (`host:port`) is the variable `jax.distributed.initialize()` itself falls back to;
JAX_NUM_PROCESSES and JAX_PROCESS_ID complete the set for code that reads them.
"""

from __future__ import annotations

from trainhook.gang import keys
from trainhook.webhook.admission.member import Member, Problems

# Kubeflow JAXJob's names (its cpu-demo example passes them to jax.distributed.initialize).
COORDINATOR_PORT = "COORDINATOR_PORT"
COORDINATOR_ADDRESS = "COORDINATOR_ADDRESS"
NUM_PROCESSES = "NUM_PROCESSES"
PROCESS_ID = "PROCESS_ID"
# JAX's own: jax.distributed.initialize() reads JAX_COORDINATOR_ADDRESS when no address is passed.
JAX_COORDINATOR_ADDRESS = "JAX_COORDINATOR_ADDRESS"
JAX_NUM_PROCESSES = "JAX_NUM_PROCESSES"
JAX_PROCESS_ID = "JAX_PROCESS_ID"


def build_env(member: Member, gpus: int, problems: Problems) -> list[tuple[str, str]]:
    coordinator, port = member.rank0_address, str(member.port)
    processes, process_id = str(member.shape.size), str(member.rank)
    return [
        (keys.PYTHONUNBUFFERED, "1"),
        (COORDINATOR_PORT, port),
        (COORDINATOR_ADDRESS, coordinator),
        (NUM_PROCESSES, processes),
        (PROCESS_ID, process_id),
        (JAX_COORDINATOR_ADDRESS, f"{coordinator}:{port}"),
        (JAX_NUM_PROCESSES, processes),
        (JAX_PROCESS_ID, process_id),
    ]
