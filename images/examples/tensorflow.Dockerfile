# An example TensorFlow training image: Python and CPU TensorFlow, and nothing of trainhook (the webhook delivers
# the launcher into the pod). hack/images.py builds it for the node's e2e tests (a TensorFlow PS gang):
#   --build-arg PYTHON_IMAGE=<the local Debian bookworm + python3 base>
ARG PYTHON_IMAGE=python:3.11.15-slim-bookworm
FROM ${PYTHON_IMAGE}
ARG TENSORFLOW=tensorflow-cpu==2.21.0
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv && /opt/venv/bin/pip install "$TENSORFLOW" \
 && /opt/venv/bin/python -c 'import tensorflow as tf; print(tf.__version__)'
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
WORKDIR /workspace
CMD ["python"]
