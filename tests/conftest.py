"""Shared fixtures: the real webhook server over HTTPS."""

from __future__ import annotations

import pytest

from webhook_process import start_webhook


@pytest.fixture(scope="session")
def webhook(tmp_path_factory):
    hook = start_webhook(tmp_path_factory.mktemp("webhook"),
                         extra_args=["--launcher-image", "registry.example/launcher:1"])
    yield hook
    hook.stop()
