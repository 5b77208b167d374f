"""The cheapest correct aiohttp webhook: parse the review, allow it. The benchmark's yardstick.

It parses and answers with the same JSON libraries as trainhook's server (json.loads in, orjson out), so that
the comparison measures the webhook's own work, not a choice of library."""

from __future__ import annotations

import json
import ssl
import sys

import orjson
from aiohttp import web


async def allow(request: web.Request) -> web.Response:
    body = json.loads(await request.read())
    answer = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "response": {"uid": body["request"]["uid"], "allowed": True}}
    return web.Response(body=orjson.dumps(answer), content_type="application/json")


async def health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def main() -> None:
    cert, key, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    app = web.Application()
    app.router.add_post("/mutate", allow)
    app.router.add_get("/healthz", health)
    web.run_app(app, host="127.0.0.1", port=port, ssl_context=context, print=None, access_log=None)


if __name__ == "__main__":
    main()
