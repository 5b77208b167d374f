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
RUN /opt/trainhook/bin/pip install --no-deps . && /opt/trainhook/bin/pip check

# The delivered entry point, /trainhook/bin/trainhook-launch (launcher/entry/, docs/use/delivery.md): a static program,
# so that images without a shell run it too. musl keeps it about 20 KB (glibc's static libc is 700 KB).
FROM ${PYTHON_IMAGE} AS entry
RUN apt-get update && apt-get install -y --no-install-recommends gcc musl-tools && rm -rf /var/lib/apt/lists/*
COPY trainhook/launcher/entry/trainhook-launch.c /src/trainhook-launch.c
RUN musl-gcc -static -Os -s -o /trainhook-launch /src/trainhook-launch.c

FROM ${PYTHON_IMAGE}
COPY --from=build /opt/trainhook /opt/trainhook
# Where launcher/deliver.py looks for it (PREBUILT): the init container copies it into every gang pod.
COPY --from=entry /trainhook-launch /opt/trainhook/libexec/trainhook/trainhook-launch
# The launcher zip the init container delivers into every gang pod, built once here instead of in each pod
# (launcher/deliver.py PREBUILT_ZIP, used while its key matches the installed modules; in this stage because
# the build stage is the webhook image's too). After the program: the zip stores its bytecode uncompressed
# where it fits a ConfigMap beside that program (deliver.build_zip), as the webhook's ConfigMap does.
RUN /opt/trainhook/bin/python -c "from trainhook.launcher import deliver; deliver.write_prebuilt()"
ENV PATH=/opt/trainhook/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# Numeric, so the kubelet can check runAsNonRoot; the webhook gives the init container the same user.
USER 65532:65532
ENTRYPOINT ["trainhook-launch"]
