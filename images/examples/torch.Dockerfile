# An example training image: Python and CPU torch, and nothing of trainhook (the webhook delivers the launcher
# into the pod; the image needs none of ours). hack/images.py builds it for the node's e2e tests:
#   --build-arg PYTHON_IMAGE=<the local Debian bookworm + python3 base>
# and mounts the host's local wheel directories read-only at /wheels (PIP_FIND_LINKS), so torch's CPU wheel
# comes from this machine's disk when it is there and from the index otherwise.
ARG PYTHON_IMAGE=python:3.11.15-slim-bookworm
FROM ${PYTHON_IMAGE}
ARG TORCH=torch==2.13.0
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv && PIP_FIND_LINKS="$(ls -d /wheels/* 2>/dev/null | paste -sd' ')" \
      /opt/venv/bin/pip install "$TORCH" && /opt/venv/bin/python -c 'import torch; print(torch.__version__)'
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /workspace
CMD ["python"]
