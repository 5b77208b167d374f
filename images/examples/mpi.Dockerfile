# An example MPI training image: OpenMPI, mpi4py and NumPy, plus ssh for the ssh transport, and nothing of
# trainhook (the webhook delivers the launcher into the pods; the kubexec transport needs no sshd).
# examples/mpi/Dockerfile on Debian's packages, for the node's e2e tests; hack/images.py builds it with
#   --build-arg PYTHON_IMAGE=<the local Debian bookworm + python3 base>
# `StrictModes no`: keys come from a Secret mounted at /root/.ssh, whose directory a kubelet makes world-writable
# (1777), which sshd's default StrictModes refuses ("bad ownership or modes"); mpi-operator's images do the same.
ARG PYTHON_IMAGE=python:3.11.15-slim-bookworm
FROM ${PYTHON_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends openmpi-bin python3-mpi4py python3-numpy \
      openssh-client openssh-server \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /run/sshd \
 && sed -i 's/^#\?StrictModes .*/StrictModes no/' /etc/ssh/sshd_config
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /workspace
