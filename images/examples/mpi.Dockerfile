# An example MPI training image: OpenMPI, mpi4py and NumPy, and nothing of trainhook (the webhook delivers the
# launcher into the pods; the kubexec transport needs no sshd). examples/mpi/Dockerfile without ssh, for the
# node's e2e tests; hack/images.py builds it with
#   --build-arg PYTHON_IMAGE=<the local Debian bookworm + python3 base>
ARG PYTHON_IMAGE=python:3.11.15-slim-bookworm
FROM ${PYTHON_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends openmpi-bin python3-mpi4py python3-numpy \
 && rm -rf /var/lib/apt/lists/*
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /workspace
