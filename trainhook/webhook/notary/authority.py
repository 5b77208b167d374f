"""What the notary asks of the cluster (the `Authority`), and the two ways an answer can fail: the one module the
notary's listener (service.py) and both authorities (cluster.py: the API server; local.py: a `trainhook local` run's
files) import, so none of them imports another's module for its exceptions.
"""

from __future__ import annotations

from typing import Protocol


class Unreachable(Exception):
    """The authority cannot answer now (the API server is unreachable, slow, or erring): HTTP 503."""


class Conflict(Exception):
    """A write's precondition (resourceVersion) failed: someone else wrote first."""


class Authority(Protocol):
    """What the notary asks of the cluster; every method raises Unreachable when it cannot answer."""

    async def review_token(self, token: str) -> dict:
        """The TokenReview status of `token` for audience `trainhook`."""

    async def get_pod(self, namespace: str, name: str) -> dict | None: ...

    async def list_gang_pods(self, namespace: str, job: str) -> list[dict]:
        """Pods of `namespace` labeled trainhook.dev/job-name=`job`."""

    async def get_workload(self, namespace: str, kind: str, name: str) -> dict | None: ...

    async def patch_workload(self, namespace: str, kind: str, name: str, patch: dict) -> None:
        """A merge patch; Conflict when its resourceVersion is not the current one."""

    async def scale_to_zero(self, namespace: str, name: str) -> None: ...

    async def create_event(self, namespace: str, body: dict) -> None:
        """Create an Event; one that exists already (a retried record) is not an error."""
