"""The rooms' common ground: the real webhook server over HTTPS, and the order of the run.

The tests live in rooms by what they test (tests/webhook, tests/launcher, tests/local, tests/cli, tests/chart,
tests/cluster, tests/repo, tests/e2e), each with its own conftest.py; their shared helpers are plain modules in
tests/support/ (on the path through pyproject's `pythonpath`). The `webhook` fixture is here because four rooms
ask for it and one process serves them all.

The order: tests/e2e runs first and in one piece. Its conftest stops the node right after the last e2e test, and
`trainhook local` tests (network namespaces, root) must never run while the node has pods; the rest of the run
must not share the cores with an idle cluster either. Collection sorts by path, which would put tests/chart and
tests/cli before tests/e2e: the hook below moves the e2e items to the front, keeping every other order
(tests/repo/test_test_order.py checks it).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from webhook_process import start_webhook

E2E = Path(__file__).resolve().parent / "e2e"


def is_e2e(item: pytest.Item) -> bool:
    return Path(item.path).resolve().is_relative_to(E2E)


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: not is_e2e(item))  # stable: each group keeps its collected order


@pytest.fixture(scope="session")
def webhook(tmp_path_factory):
    hook = start_webhook(tmp_path_factory.mktemp("webhook"),
                         extra_args=["--launcher-image", "registry.example/launcher:1"])
    yield hook
    hook.stop()
