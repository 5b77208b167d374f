"""End-to-end tests on a real node (hack/node.py): kubelet, containerd, the pod network, cluster DNS, and the chart
installed by Helm with images built from this repository (hack/images.py). See docs/develop/control-plane.md.

Session fixtures, in the order they come up:
- `node`: the node, started for this session (about 30 s with images cached; the first run also builds the
  binaries and images, minutes) unless one is already up (`make node-up`), which is then used and left running.
- `release`: `helm upgrade --install` of charts/trainhook, with the local images' values and pull policy and nothing
  else, waited on until the webhook's Deployment is available and its caBundle injected.

Root and the node's Debian packages are required (bridge, iptables, mounts; `.ci/run` installs them): without
them the tests fail, naming the fix, never skip. TRAINHOOK_E2E=0 leaves them out of the run on purpose (they are
deselected, and pytest says how many).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import uuid
from pathlib import Path

import pytest

from e2e_helpers import RELEASE, RELEASE_NAMESPACE, REPO, Cluster, helm, image_values, node_mod, wait_for


def pytest_configure(config):
    config.addinivalue_line("markers", "e2e: needs the real node (hack/node.py: root, containerd, kubelet)")


HERE = Path(__file__).parent
# The node this session started, if any: stopped right after the last e2e test, not at the end of the whole
# session, so the rest of `make test` does not share the 2 cores with an idle cluster.
_started: dict[str, Path] = {}


def _is_e2e(item) -> bool:
    return item is not None and HERE in Path(item.fspath).parents


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _is_e2e(item):
            item.add_marker(pytest.mark.e2e)
    if os.environ.get("TRAINHOOK_E2E") == "0":
        left_out = [item for item in items if _is_e2e(item)]
        if left_out:
            config.hook.pytest_deselected(items=left_out)
            items[:] = [item for item in items if not _is_e2e(item)]


def _stop_started_node() -> None:
    state_dir = _started.pop("state_dir", None)
    if state_dir is not None:
        t0 = time.monotonic()
        node_mod.ensure_down(state_dir)
        print(f"\nnode: stopped in {time.monotonic() - t0:.1f}s", file=sys.stderr)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    if _is_e2e(item) and not _is_e2e(nextitem):
        _stop_started_node()


@pytest.fixture(scope="session")
def node():
    if os.geteuid() != 0:
        pytest.fail("the node needs root (bridge, iptables, cgroups, mounts): run the tests as root, or leave the "
                    "e2e tests out with TRAINHOOK_E2E=0")
    missing = [c for c in ("containerd", "buildah", "debootstrap", "iptables") if not shutil.which(c)]
    if missing:  # .ci/run installs them and checks that they are there
        pytest.fail(f"the node needs {', '.join(missing)}: install the Debian packages .ci/run lists")
    state_dir = node_mod.default_state_dir()
    started, t0 = None, time.monotonic()
    try:
        # die_with_parent: if pytest itself is killed, the node's daemons get SIGTERM (the next `up` or `down`
        # cleans what they leave).
        running, started = node_mod.ensure_up(state_dir, die_with_parent=True)
    except node_mod.cluster.ClusterError as e:
        pytest.fail(f"the node did not come up: {e}")
    print(f"\nnode: {'started' if started else 'already up'} in {time.monotonic() - t0:.0f}s", file=sys.stderr)
    if started:
        _started["state_dir"] = state_dir
    try:
        yield Cluster(running)
    finally:
        _stop_started_node()


@pytest.fixture(scope="session")
def release(node):
    """The chart, installed unmodified; yields the seconds `helm upgrade --install --wait` took."""
    t0 = time.monotonic()
    helm(node, "upgrade", "--install", RELEASE, str(REPO / "charts" / "trainhook"), "--namespace", RELEASE_NAMESPACE,
          "--create-namespace", "--wait", "--timeout", "240s", *image_values(node.images))
    took = time.monotonic() - t0

    def injected():
        config = json.loads(node.kubectl("get", "mutatingwebhookconfiguration", RELEASE, "-o", "json"))
        return all(w["clientConfig"].get("caBundle") for w in config["webhooks"])
    wait_for(injected, 60, "the webhook to inject its caBundle")
    yield took


@pytest.fixture
def namespace(node):
    """A fresh namespace, deleted afterwards (without waiting: its pods go in the background)."""
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    node.kubectl("create", "namespace", name)
    # The controller-manager gives the namespace's default ServiceAccount its token; pods wait for it otherwise.
    wait_for(lambda: json.loads(node.kubectl("get", "serviceaccount", "default", "-n", name, "-o", "json"))
             .get("secrets"), 30, f"the default ServiceAccount of {name}")
    yield name
    node.kubectl("delete", "namespace", name, "--wait=false", check=False)
