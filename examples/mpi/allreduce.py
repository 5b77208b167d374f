"""An mpi4py allreduce across the gang, unchanged from what a Kubeflow MPIJob would run.

Every rank contributes rank + 1; the sum must be n(n+1)/2 on every rank. Rank 0 also gathers each rank's host,
so the output shows the ranks really ran in different pods. Exits non-zero when the result is wrong.
"""

import socket

from mpi4py import MPI


def main() -> None:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    total = comm.allreduce(rank + 1, op=MPI.SUM)
    expected = size * (size + 1) // 2
    hosts = comm.gather(socket.gethostname(), root=0)
    if rank == 0:
        library = MPI.Get_library_version().splitlines()[0].strip()
        print(f"allreduce over {size} ranks on {len(set(hosts))} hosts ({', '.join(sorted(set(hosts)))}): "
              f"sum={total} expected={expected}", flush=True)
        print(f"mpi library: {library}", flush=True)
    if total != expected:
        raise SystemExit(f"rank {rank}: allreduce gave {total}, expected {expected}")


if __name__ == "__main__":
    main()
