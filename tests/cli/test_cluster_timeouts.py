"""The timeouts trainhook gives the kubernetes client are ones the client accepts, for a followed stream too.

A real node's e2e run found it: `_request_timeout=(10.0, None)` (an unbounded read for `logs -f`) is refused by the
kubernetes client's own validation (pydantic, v35+) before any request is made, so every followed log failed with a
ValidationError. Shown with the installed client against a port where nothing listens: the call must get as far as
connecting (a connection error), never be refused by the client for its arguments."""

from __future__ import annotations

import socket

import pytest
from kubernetes import client

from trainhook.cluster import reach


@pytest.mark.parametrize("streaming", [False, True])
def test_the_client_accepts_the_timeouts_and_tries_to_connect(streaming):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    configuration = client.Configuration(host=f"https://127.0.0.1:{port}")
    configuration.retries = 0
    api = client.CoreV1Api(client.ApiClient(configuration))
    with pytest.raises(Exception) as raised:
        api.read_namespaced_pod_log("p", "ns", follow=streaming, _preload_content=False,
                                    _request_timeout=reach.request_timeout(streaming))
    assert "ValidationError" not in type(raised.value).__name__, raised.value
    assert "Connection refused" in str(raised.value) or "Max retries" in str(raised.value), raised.value
