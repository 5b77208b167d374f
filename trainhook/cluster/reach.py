"""Why the API server could not be used at all, said in one line that names it and the fix.

A Kubernetes client call whose server is not there fails deep in urllib3: a MaxRetryError wrapping a
NewConnectionError wrapping a ConnectionRefusedError, which the CLI printed as a 70-line traceback (issue 34). Every
call of trainhook.cluster.client.Cluster turns such a failure into one ClusterUnreachable (or, when the server refuses
the credentials or the call, ClusterDenied) whose message says which server (the kubeconfig's URL and where it came
from), what happened, and what to do. This module is the pure part: the retry and timeout bounds the client is
built with, and the reading of an exception chain into (what happened, the fix).

The bounds: urllib3 retries a failed connection three times by default and the kubernetes client sets no timeout,
so an address that drops packets held a command for minutes. Here a connection that cannot be made is not retried
(the server is not there; a retry only repeats that), a dropped connection of an idempotent request is retried
once (a pooled keep-alive connection the server closed), and connecting (TCP and the TLS handshake) gets
CONNECT_TIMEOUT seconds. A request's answer gets READ_TIMEOUT seconds between two reads, except a followed log,
which may stay silent as long as the training does.
"""

from __future__ import annotations

import socket
import ssl

CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 120.0  # the API server itself ends an ordinary request after 60 s (--request-timeout)
# What a fresh kubeconfig, --context or --kubeconfig fixes; said by most of the fixes below.
CHOOSE = "--kubeconfig (or $KUBECONFIG) and --context choose the cluster"


def retries():
    """urllib3's Retry for the client: no retry of a connection that cannot be made, one of a dropped one."""
    from urllib3.util.retry import Retry

    return Retry(total=1, connect=0, other=0, redirect=0)


def bound(api_client) -> None:
    """Give a kubernetes ApiClient's new connections trainhook's retries, unless its Configuration sets its own.
    Set on its urllib3 PoolManager, whose connection pools are made from these keywords at first use, so a client
    built anywhere (a kubeconfig, in-cluster, the SDK's client_configuration) is bounded alike."""
    if getattr(api_client.configuration, "retries", None) is not None:
        return
    pool_manager = getattr(getattr(api_client, "rest_client", None), "pool_manager", None)
    if pool_manager is not None:
        pool_manager.connection_pool_kw["retries"] = retries()


# How long a followed stream (`logs -f`) may go silent: a training may print nothing for hours. Not None: the
# kubernetes client (v35+) validates `_request_timeout` and refuses None in the pair (a real node's e2e run).
STREAM_READ_TIMEOUT = 7 * 24 * 3600.0


def request_timeout(streaming: bool = False) -> tuple[float, float]:
    """The kubernetes client's `_request_timeout`: (connect, read) seconds; a followed stream may be silent for
    STREAM_READ_TIMEOUT."""
    return (CONNECT_TIMEOUT, STREAM_READ_TIMEOUT if streaming else READ_TIMEOUT)


def chain(error: BaseException) -> list[BaseException]:
    """The error and everything it wraps: causes, contexts, urllib3's `reason`, exceptions among its args."""
    found: list[BaseException] = []
    todo: list[object] = [error]
    while todo:
        item = todo.pop(0)
        if not isinstance(item, BaseException) or any(item is seen for seen in found):
            continue
        found.append(item)
        todo += [item.__cause__, item.__context__, getattr(item, "reason", None), *item.args]
    return found


def one_line(text: object) -> str:
    return " ".join(str(text).split())


def _ssl_reason(error: BaseException) -> str:
    """`certificate verify failed: self-signed certificate in certificate chain`, without the file and line."""
    verify = getattr(error, "verify_message", None)
    return one_line(f"certificate verify failed: {verify}" if verify else
                    getattr(error, "reason", None) or getattr(error, "strerror", None) or error)


def failure(error: BaseException) -> tuple[str, str]:
    """(what happened, the fix) for a failure to reach the API server or to complete a request with it."""
    from urllib3.exceptions import ConnectTimeoutError, NewConnectionError, ProtocolError, ReadTimeoutError

    errors = chain(error)

    def first(*types: type) -> BaseException | None:
        return next((e for e in errors if isinstance(e, types)), None)

    unresolved = first(socket.gaierror)
    if unresolved is not None:
        return (f"its host name does not resolve ({one_line(getattr(unresolved, 'strerror', None) or unresolved)})",
                f"check the server address in the kubeconfig (kubectl config view --minify); {CHOOSE}")
    if first(ConnectionRefusedError) is not None:
        return ("connection refused: nothing listens at that address",
                f"start the cluster, or point at the running one: check the server address in the kubeconfig "
                f"(kubectl config view --minify); {CHOOSE}")
    untrusted = first(ssl.SSLCertVerificationError, ssl.CertificateError)
    if untrusted is not None:
        return (f"its TLS certificate is not trusted ({_ssl_reason(untrusted)})",
                "the kubeconfig's certificate-authority(-data) must be the CA that signed the API server's "
                f"certificate: get a fresh kubeconfig for this cluster (its CA may have been rebuilt); {CHOOSE}")
    not_tls = first(ssl.SSLError)
    if not_tls is not None:
        return (f"it does not answer TLS ({_ssl_reason(not_tls)})",
                "the server address must be the API server's HTTPS address and port (kubectl cluster-info shows "
                f"it): another service, or plain HTTP, answers there; {CHOOSE}")
    # A connect timeout, or a TLS handshake or an answer that did not come (NewConnectionError is urllib3's
    # subclass of ConnectTimeoutError for every failed connection, timed out or not).
    timeouts = [e for e in errors if isinstance(e, (TimeoutError, ReadTimeoutError, ConnectTimeoutError))
                and not isinstance(e, NewConnectionError)]
    if timeouts:
        said = next((e for e in timeouts if isinstance(e, (ReadTimeoutError, ConnectTimeoutError))), timeouts[0])
        return (f"it did not answer in time ({one_line(said)})",
                f"check that the address is right and reachable from here (VPN, firewall, proxy), then retry; "
                f"{CHOOSE}")
    broken = first(ProtocolError, ConnectionError)
    if broken is not None:
        return (f"the connection broke ({one_line(broken)})",
                f"retry; if it lasts, check the server address and port (a proxy or another service may answer "
                f"there); {CHOOSE}")
    other = first(NewConnectionError, OSError)
    return (one_line(other or error) or type(error).__name__,
            f"check the server address in the kubeconfig (kubectl config view --minify); {CHOOSE}")


def where(server: str, origin: str) -> str:
    return f"{server} ({origin})" if origin else server


def unreachable_message(error: BaseException, server: str, origin: str = "") -> str:
    what, fix = failure(error)
    return f"cannot connect to the Kubernetes API server {where(server, origin)}: {what}. Fix: {fix}"


def unauthorized_message(server: str, origin: str = "") -> str:
    return (f"the Kubernetes API server {where(server, origin)} refused the credentials (401 Unauthorized). Fix: "
            "log in again or get a fresh kubeconfig (the token or client certificate has expired, been revoked, or "
            f"is another cluster's); {CHOOSE}")


def forbidden_message(message: str, server: str, origin: str = "") -> str:
    place = f"{server}, {origin}" if origin else server
    return (f"Error from server (Forbidden): {one_line(message)} (API server {place}). Fix: ask the "
            "cluster's admin for that permission (check with kubectl auth can-i), or use a --context whose user has "
            "it")
