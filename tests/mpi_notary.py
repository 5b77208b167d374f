"""A notary for tests of MPI processes outside `trainhook local`: a real HTTPS server (its own CA, the hostname
checked by the launcher's identity client) that answers POST /v1/credential with one gang's key to a caller
presenting the member token, and 401 to anyone else, as docs/security.md's notary does. The membership rules
themselves are the notary's own tests'; here only the launcher's side of the key exchange is real and exercised.
"""

from __future__ import annotations

import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from trainhook.certs.build import CA_FILE, CERT_FILE, KEY_FILE, write_bundle

MEMBER_TOKEN = "member-identity-token"


class MemberNotary:
    def __init__(self, directory: Path, namespace: str, job: str, key: bytes):
        self.namespace, self.job, self.key = namespace, job, key
        certs = write_bundle(directory / "certs", ["localhost"])
        self.ca_pem = (certs / CA_FILE).read_text()
        self.token_file = directory / "identity-token"
        self.token_file.write_text(MEMBER_TOKEN)
        self.calls: list[str] = []
        notary = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                authorization = self.headers.get("Authorization", "")
                notary.calls.append(f"{self.path} {authorization}")
                if self.path != "/v1/credential":
                    self.answer(404, {"error": "no such call"})
                elif authorization != f"Bearer {MEMBER_TOKEN}":
                    self.answer(401, {"error": "token invalid"})
                else:
                    self.answer(200, {"namespace": notary.namespace, "job": notary.job,
                                      "gang": f"{notary.namespace}/{notary.job}/uid", "key": notary.key.hex()})

            def answer(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(certs / CERT_FILE), str(certs / KEY_FILE))
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://localhost:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def env(self) -> dict[str, str]:
        """What the webhook injects into a member (the identity token's path stands in for the projected volume)."""
        return {"TRAINHOOK_NOTARY": self.url, "TRAINHOOK_NOTARY_CA": self.ca_pem,
                "TRAINHOOK_IDENTITY_TOKEN": str(self.token_file)}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
