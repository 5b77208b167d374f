"""MPI gangs: the launcher pod's mpirun, the workers' mpi-worker, the control channel between them, and the rsh
agent (kubexec) with its transports. Independent of launcher.coordination and launcher.wait.
"""
