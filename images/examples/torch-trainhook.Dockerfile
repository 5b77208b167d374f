# TEMPORARY, for the node's e2e tests only (tests/e2e/test_training.py): the example torch image plus trainhook's
# launcher venv, so a test can wrap a training command by hand in `trainhook-launch run --` until the webhook's
# delivery of the launcher (docs/delivery.md) is what the e2e tests exercise. User images never need this.
# Both images start FROM the same local base, so the copied venv's /usr/bin/python3 is the same interpreter.
ARG TORCH_IMAGE
ARG LAUNCHER_IMAGE
FROM ${LAUNCHER_IMAGE} AS launcher
FROM ${TORCH_IMAGE}
COPY --from=launcher /opt/trainhook /opt/trainhook
# torch's venv first (python, torchrun), then trainhook-launch.
ENV PATH=/opt/venv/bin:/opt/trainhook/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
