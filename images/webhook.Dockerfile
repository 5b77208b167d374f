# The webhook image: `trainhook-webhook`, what the chart's Deployment runs. Build from the repository root:
#   docker build -f images/webhook.Dockerfile -t ghcr.io/trainhook/webhook:0.1.0 .     (or: make images)
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
# Numeric, so the kubelet can check runAsNonRoot; the chart's podSecurityContext uses the same IDs.
USER 65532:65532
EXPOSE 9443
ENTRYPOINT ["trainhook-webhook"]
