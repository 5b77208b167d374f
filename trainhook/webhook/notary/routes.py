"""The notary's HTTP API (docs/operate/security.md's table is the contract with launcher/): each route authenticates
the pod's token, verifies its membership (service.py's `Notary.verify`) before it reads any body, and maps the
outcome to a status: 401 unauthenticated, 403 refused, 400 malformed, 503 not decidable yet (with Retry-After).
A refusal sent before the body arrived closes the connection, so a stranger cannot hold one with a body it never
sends (issue 31 item 3; webhook/connections.py evicts one that stalls).
"""

from __future__ import annotations

import asyncio
import json
import time

from aiohttp import web

from trainhook.webhook.connections import NOTARY as NOTARY_LIMITS
from trainhook.webhook.notary import progress as notary_progress
from trainhook.webhook.notary.authority import Unreachable
from trainhook.webhook.notary.membership import Refusal
from trainhook.webhook.notary.records import BadBody, parse_event, parse_outcome
from trainhook.webhook.notary.service import Notary, Verified
from trainhook.webhook.serving import LIMITS, awaiting_body

MAX_BODY = 64 * 1024  # an outcome or an event is a few hundred bytes
MAX_TOKEN = 16 * 1024
BODY_DEADLINE = 10.0
RETRY_AFTER = "2"


NOTARY = web.AppKey("notary", Notary)


def bearer_token(request: web.Request) -> str:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip() or len(token) > MAX_TOKEN:
        raise Refusal(401, "no bearer token: send Authorization: Bearer <the projected token>")
    return token.strip()


async def read_json(request: web.Request) -> object:
    """The request's body as JSON. A body that came with its head (a launcher's always does) is read at once; one
    still to come is awaited within BODY_DEADLINE, its connection evictable meanwhile (connections.py)."""
    if request.content.is_eof():  # the parser has the whole body: nothing to wait for, nothing to guard
        raw = await request.read()
    else:
        try:
            async with asyncio.timeout(BODY_DEADLINE):
                with awaiting_body(request):
                    raw = await request.read()
        except TimeoutError:
            raise BadBody(f"the body did not arrive within {BODY_DEADLINE:.0f} s") from None
    try:
        return json.loads(raw or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadBody(f"the body is not JSON: {e}") from None
    except RecursionError:
        raise BadBody("the body is not JSON: nested too deeply") from None


def refusal_answer(notary: Notary, who: str, status: int, reason: str) -> web.Response:
    notary.refusals.refused(who, status, reason)
    headers = {"Retry-After": RETRY_AFTER} if status == 503 else None
    return web.json_response({"error": reason}, status=status, headers=headers)


def handler(action, shared: bool = False):
    """Wrap an action(notary, verified, body) into a handler: authenticate, verify, map errors to statuses.
    `shared`: the action may be judged on a recent copy of the gang's anchor (Notary.verify says when)."""

    async def handle(request: web.Request) -> web.Response:
        started = time.perf_counter()
        response = await answer(request)
        request.app[NOTARY].metrics.answered(request.path, response.status, time.perf_counter() - started)
        return response

    async def answer(request: web.Request) -> web.Response:
        notary = request.app[NOTARY]
        who = request.remote or "?"
        try:
            token = bearer_token(request)
            verified = await notary.verify(token, shared)  # before the body: a stranger's is never read
            who = f"{verified.place.namespace}/{verified.place.pod}"
            body = await read_json(request) if request.method == "POST" else None
            return web.json_response(await action(notary, verified, body))
        except Refusal as e:
            return unread_closes(request, refusal_answer(notary, e.who or who, e.status, e.reason))
        except BadBody as e:
            return unread_closes(request, refusal_answer(notary, who, 400, str(e)))
        except Unreachable as e:
            return unread_closes(request, refusal_answer(notary, who, 503, f"cannot decide now: {e}"))

    return handle


def unread_closes(request: web.Request, response: web.Response) -> web.Response:
    """A refusal sent before the body arrived closes the connection: aiohttp would otherwise wait for the body it
    must skip before the next request, holding the connection for whoever refused to send it."""
    if not request.content.is_eof():
        response.force_close()
    return response


def coordinator_only(verified: Verified, what: str) -> None:
    if not verified.gang.coordinator:
        raise Refusal(403, f"pod {verified.place.namespace}/{verified.place.pod} is not the coordinator of gang "
                           f"{verified.gang.namespace}/{verified.gang.job} (rank 0's pod {verified.gang.anchor_pod} "
                           f"is): only it may {what}")


async def credential(notary: Notary, verified: Verified, body: object) -> dict:
    gang = verified.gang
    if gang.coordinator and notary.current_outcome(verified) is None:  # rank 0's launcher starting: a gang start
        created = ((verified.anchor_workload or {}).get("metadata") or {}).get("creationTimestamp")
        notary.metrics.gang_started(gang.gang_id, gang.namespace, gang.job, verified.place.member.framework, created)
    return notary.credential(verified)


async def get_outcome(notary: Notary, verified: Verified, body: object) -> dict:
    return {"outcome": notary.current_outcome(verified)}


async def post_outcome(notary: Notary, verified: Verified, body: object) -> dict:
    outcome = parse_outcome(body)
    coordinator_only(verified, "record the gang's outcome")
    recorded = await notary.record(verified, outcome)
    gang = verified.gang
    notary.metrics.gang_finished(gang.gang_id, gang.namespace, gang.job, verified.place.member.framework,
                                 {**recorded, "started": recorded.get("started") or outcome.get("started")})
    return {"outcome": recorded}


async def post_event(notary: Notary, verified: Verified, body: object) -> dict:
    kind, reason, message = parse_event(body)
    coordinator_only(verified, "emit the gang's events")
    await notary.emit(verified, kind, reason, message)
    if reason == "GangRestarted":
        notary.metrics.gang_restarted(verified.gang.namespace, verified.place.member.framework)
    return {"emitted": reason}


def create_app(notary: Notary) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY)
    app[NOTARY] = notary
    app[LIMITS] = NOTARY_LIMITS  # a gang's burst: every member's pod connects at once (webhook/connections.py)
    app.router.add_post("/v1/credential", handler(credential, shared=True))
    app.router.add_get("/v1/outcome", handler(get_outcome))
    app.router.add_post("/v1/outcome", handler(post_outcome))
    app.router.add_post("/v1/event", handler(post_event))
    app.router.add_post("/v1/progress", handler(notary_progress.post_progress(notary_progress.Gate())))
    return app
