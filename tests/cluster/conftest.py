"""The cluster room: tests that need the real Kubernetes v1.20 control plane (hack/cluster.py; its binaries are built
by hack/k8s-build.sh first if missing, which takes minutes on a fresh machine). No kubelet: pods stay Pending.

The fixtures every test here may ask for, defined once so that one control plane serves the whole session:

`control_plane` (session): etcd + kube-apiserver + kube-controller-manager on 127.0.0.1, free ports, in a pytest
temp dir; stopped at the end, also when tests fail. It yields a `ControlPlane`: `.host`, `.kubeconfig`,
`.ca_file`, `.ca_pem`, `.api_client()`, `.token_client(token)`, `.env()`, `.log(component)`. Set
TRAINHOOK_CLUSTER_SCHEDULER=1 to run kube-scheduler too (pods then get PodScheduled=False/Unschedulable).

`k8s_namespace` (function): a fresh namespace whose `default` ServiceAccount has its token, deleted afterwards.

`mutating_webhook` (module): the real webhook server (tests/conftest.py's `webhook`) registered with the control
plane, in force before the first test of the module.

`notary` (module; also `gang_webhook`, for a module that runs a notary of its own with the same key): the
webhook's console script with `--notary-authority cluster` and the gang key cluster_api.NOTARY_GANG_KEY, its notary
on a free port (`.notary_url`), registered as the mutating webhook too (as the chart's Deployment is both): the gang
pods a notary is asked about were admitted and stamped under that key.

The helpers (register_webhook, wait_for_service_account_token, hack/cluster.py as `cluster`) are
tests/support/cluster_api.py's.
"""

from __future__ import annotations

import os
import time
import uuid
from contextlib import contextmanager

import pytest

from cluster_api import (cluster, register_webhook, start_notary, unregister_webhook,
                         wait_for_service_account_token)
from trainhook.gang import keys


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory):
    cp = cluster.start(tmp_path_factory.mktemp("control-plane"),
                       scheduler=bool(os.environ.get("TRAINHOOK_CLUSTER_SCHEDULER")))
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture
def k8s_namespace(control_plane):
    from kubernetes import client
    name = f"t-{uuid.uuid4().hex[:10]}"
    with control_plane.api_client() as api:
        core = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": name}})
        wait_for_service_account_token(api, name, "default")
        try:
            yield name
        finally:
            core.delete_namespace(name)


def wait_until_mutating(api, timeout: float = 30) -> None:
    """The API server picks a new webhook configuration up through an informer: retry a dry-run create of a
    labeled Service until the webhook has made it headless."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    body = {"metadata": {"name": "probe", "labels": {keys.JOB_NAME: "probe"}}, "spec": {"ports": [{"port": 1}]}}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        created = core.create_namespaced_service("default", body, dry_run="All")
        if created.spec.publish_not_ready_addresses:
            return
        time.sleep(0.3)
    raise TimeoutError("the trainhook webhook configuration did not take effect")


@contextmanager
def registered(control_plane, hook):
    """`hook` registered as the mutating webhook (cluster_api.register_webhook), in force, until the block ends."""
    with control_plane.api_client() as api:
        register_webhook(api, hook.ca_file.read_bytes(), hook.url + "/mutate")
        wait_until_mutating(api)
        try:
            yield hook
        finally:
            unregister_webhook(api)


@pytest.fixture(scope="module")
def mutating_webhook(control_plane, webhook):
    """The real webhook server (tests/conftest.py) registered with the control plane for this module."""
    with registered(control_plane, webhook):
        yield webhook


@pytest.fixture(scope="module")
def notary(gang_webhook):
    return gang_webhook


@pytest.fixture(scope="module")
def gang_webhook(control_plane, tmp_path_factory):
    hook = start_notary(control_plane, tmp_path_factory.mktemp("notary"))
    # It is the mutating webhook too, as the chart's Deployment is: gang pods are admitted and stamped with the
    # gang key their notary verifies (webhook/admission/provenance.py).
    try:
        with registered(control_plane, hook):
            yield hook
    finally:
        hook.stop()


@pytest.fixture(scope="module")
def sweeping_notary(control_plane, tmp_path_factory):
    """`gang_webhook` with the notary's sweep every second (webhook/notary/sweep.py; the chart's is 30 s)."""
    hook = start_notary(control_plane, tmp_path_factory.mktemp("sweep"), "--notary-sweep-interval", "1")
    try:
        with registered(control_plane, hook):
            yield hook
    finally:
        hook.stop()
