# An example XGBoost training image: Python and xgboost-cpu (with NumPy and SciPy), and nothing of trainhook (the
# webhook delivers the launcher into the pod). hack/images.py builds it for the node's e2e tests:
#   --build-arg PYTHON_IMAGE=<the local Debian bookworm + python3 base>
ARG PYTHON_IMAGE=python:3.11.15-slim-bookworm
FROM ${PYTHON_IMAGE}
ARG XGBOOST=xgboost-cpu==3.2.0
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv && /opt/venv/bin/pip install "$XGBOOST" \
 && /opt/venv/bin/python -c 'import xgboost; print(xgboost.__version__)'
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /workspace
CMD ["python"]
