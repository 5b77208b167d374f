# The launcher image: `trainhook-launch`, the gang-wait init container the webhook injects (`trainhook-launch
# wait`) and the in-pod launcher (contract section 6). Build from the repository root:
#   docker build -f images/launcher.Dockerfile -t ghcr.io/trainhook/launcher:0.1.0 .     (or: make images)
# The base is an exact Python patch release on Debian bookworm. To pin its digest as well:
#   --build-arg PYTHON_IMAGE=python:3.11.15-slim-bookworm@sha256:<digest>
ARG PYTHON_IMAGE=python:3.11.15-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Dependencies first, in their own layer: a source change does not reinstall them.
COPY images/constraints.txt images/constraints.txt
RUN python -m venv /opt/trainhook && /opt/trainhook/bin/pip install --no-deps -r images/constraints.txt
COPY pyproject.toml README.md ./
COPY trainhook trainhook
COPY webhook webhook
COPY launcher launcher
COPY certs certs
RUN /opt/trainhook/bin/pip install --no-deps . && /opt/trainhook/bin/pip check

FROM ${PYTHON_IMAGE}
COPY --from=build /opt/trainhook /opt/trainhook
ENV PATH=/opt/trainhook/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# Numeric, so the kubelet can check runAsNonRoot; the webhook gives the init container the same user.
USER 65532:65532
ENTRYPOINT ["trainhook-launch"]
