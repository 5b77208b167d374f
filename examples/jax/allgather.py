"""Multi-process JAX: `jax.distributed.initialize` across pods, then computations every process checks.

The code a Kubeflow JAXJob runs, unchanged: COORDINATOR_ADDRESS, COORDINATOR_PORT, NUM_PROCESSES and
PROCESS_ID come from the environment (trainhook also injects JAX_COORDINATOR_ADDRESS, the variable
`jax.distributed.initialize()` reads by itself). CPU collectives go over Gloo. Every process contributes a
row that depends on its id; `process_allgather` must give every process every row, in process order, and a
jitted sum over an array sharded across the processes must equal the sum every process computes alone.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec

jax.config.update("jax_cpu_collectives_implementation", "gloo")


def row(process_id: int) -> np.ndarray:
    return np.array([process_id, process_id ** 2, 100 + process_id], dtype=np.int32)


def main() -> None:
    process_id, num_processes = int(os.environ["PROCESS_ID"]), int(os.environ["NUM_PROCESSES"])
    coordinator = f"{os.environ['COORDINATOR_ADDRESS']}:{os.environ['COORDINATOR_PORT']}"
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                               process_id=process_id)
    print(f"process {jax.process_index()}/{jax.process_count()} on {os.environ.get('HOSTNAME', '?')}: "
          f"{jax.local_device_count()} local of {jax.device_count()} devices", flush=True)

    gathered = np.asarray(multihost_utils.process_allgather(row(process_id)))
    expected = np.stack([row(i) for i in range(num_processes)])
    allgather_ok = gathered.shape == expected.shape and bool((gathered == expected).all())

    # One global array, each process holding its own row; the jitted sum runs across all of them.
    mesh = jax.make_mesh((jax.device_count(),), ("p",))
    local = np.repeat(row(process_id)[None, :], jax.local_device_count(), axis=0)
    sharded = multihost_utils.host_local_array_to_global_array(local, mesh, PartitionSpec("p"))
    total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, PartitionSpec()))(sharded)
    expected_total = sum(int(row(i).sum()) for i in range(num_processes)) * jax.local_device_count()
    sum_ok = int(total) == expected_total

    print(f"allgather {gathered.tolist()} sum {int(total)} agrees={allgather_ok and sum_ok}", flush=True)
    jax.distributed.shutdown()
    if not (allgather_ok and sum_ok):
        raise SystemExit(f"processes disagree: expected {expected.tolist()} and sum {expected_total}")


if __name__ == "__main__":
    main()
