"""How a failed API call reaches the CLI and the SDK: one exception, one line.

`ClusterError` is any failed call, its message the API server's as kubectl prints it. Its two subclasses are the
failures that no call can get past, each also a standard exception a caller may already catch:
`ClusterUnreachable` (a ConnectionError: the server is not there, is not the API server, or does not answer) and
`ClusterDenied` (a PermissionError: it refuses the credentials, 401, or the call, 403). Their messages name the
server and the fix (trainhook.cluster.reach). They are raised `from None`: the client's own error, a chain of
urllib3's, is what made a 70-line traceback of one fact (issue 34); it stays on `.original`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

from trainhook.cluster import reach


class ClusterError(Exception):
    """An API call failed; the message is the API server's, as kubectl prints it."""

    def __init__(self, message: str, status: int = 0):
        super().__init__(message)
        self.status = status


class ClusterUnreachable(ClusterError, ConnectionError):
    """The API server could not be reached or spoken to (refused, unknown host, TLS, timeout). `.server` is its
    URL, `.original` the client's own error."""

    def __init__(self, message: str, *, server: str = "", original: BaseException | None = None):
        super().__init__(message)
        self.server = server
        self.original = original


class ClusterDenied(ClusterError, PermissionError):
    """The API server refused the credentials (`.status` 401) or the call (403)."""

    def __init__(self, message: str, *, server: str = "", status: int = 0, original: BaseException | None = None):
        super().__init__(message, status)
        self.server = server
        self.original = original


def server_says(e: Exception) -> tuple[str, str]:
    """(reason, message) of an ApiException, from the Status the server answered, else the client's reason."""
    try:
        body = json.loads(getattr(e, "body", None) or "{}")
    except (TypeError, ValueError):
        body = {}
    body = body if isinstance(body, dict) else {}
    message = body.get("message") or getattr(e, "reason", None) or str(e)
    return str(body.get("reason") or getattr(e, "reason", "") or "Error"), str(message)


def api_error(e: Exception, what: str = "") -> ClusterError:
    """`Error from server (Reason): kind/name: message`, as kubectl says it, from an ApiException's Status."""
    reason, message = server_says(e)
    prefix = f"{what}: " if what else ""
    return ClusterError(f"Error from server ({reason}): {prefix}{message}", getattr(e, "status", 0) or 0)


@contextmanager
def reaching(server: str, origin: str = "") -> Iterator[None]:
    """Raise a failure to reach `server`, or its refusal of the credentials or the call, as one
    ClusterUnreachable/ClusterDenied naming it; an ApiException with another status goes on to the caller, which
    knows what its 404 means."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        yield
    except ClusterError:
        raise
    except ApiException as e:
        if e.status == 401:
            raise ClusterDenied(reach.unauthorized_message(server, origin), server=server, status=401,
                                original=e) from None
        if e.status == 403:
            raise ClusterDenied(reach.forbidden_message(server_says(e)[1], server, origin), server=server,
                                status=403, original=e) from None
        if not e.status:  # the client's own wrapping of a TLS failure (kubernetes.client.rest)
            raise ClusterUnreachable(reach.unreachable_message(e, server, origin), server=server,
                                     original=e) from None
        raise
    except (HTTPError, OSError) as e:
        raise ClusterUnreachable(reach.unreachable_message(e, server, origin), server=server, original=e) from None
