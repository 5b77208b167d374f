"""The gang key: one secret per release, from which the notary derives every gang's signing key
(docs/operate/security.md).

Why the webhook keeps it and Helm does not: a key Helm renders (`randAlphaNum` behind `lookup`) is new on every
`helm template` (Argo CD, Flux), and on an uninstall and reinstall, and replicas that started on different renders
disagree: two members of one gang admitted or served by different replicas then cannot verify each other. So:

- `load()` (before the server serves): GET the Secret; when it does not exist (and we may create it), `create` it
  with 32 random bytes. A 409 means another replica created it first: read theirs. Every replica therefore serves
  with the one key in the Secret, and a replica that cannot read it does not serve (so it is never Ready).
- `refresh()` (every little while): the Secret is the truth. A key that changed there (someone rotated it, or
  deleted the Secret and another replica made a new one) is adopted; a Secret that vanished is created again with
  the key this replica holds, so replicas still running keep agreeing with each other and with running gangs.
- With an existing Secret (the chart's gangKey.existingSecret) the webhook only reads: it never creates one.

The key never leaves the process except into that Secret; logs carry its `fingerprint()` (a one-way hash), so an
operator can compare replicas.

API calls (the chart's gang-key Role grants exactly these): `create` Secrets in the release namespace (unless the
Secret is yours) and `get` on that one Secret.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import logging
import secrets
from collections.abc import Callable
from typing import Any

log = logging.getLogger("trainhook.webhook.notary.gang_key")

DATA_KEY = "gang-key"
MIN_BYTES = 32
NEW_KEY_BYTES = 32
MANAGED_BY = "trainhook-webhook"


class GangKeyError(RuntimeError):
    """The gang key cannot be had; the message names the Secret, what is wrong and the fix."""


def fingerprint(key: bytes) -> str:
    """A short one-way digest of the key: equal on replicas that agree, useless to forge anything."""
    return hashlib.sha256(b"trainhook gang key fingerprint\0" + key).hexdigest()[:16]


def key_bytes(stored: bytes) -> bytes:
    """The key a Secret's value holds. Text (`--from-literal=gang-key=$(openssl rand -hex 32)`, or a file written
    by `openssl rand -hex 32`) loses the white space around it, such as a file's last newline; anything else is the
    key byte for byte. Why not strip everything: the webhook's own keys are random bytes, and one in about twenty
    begins or ends with a byte that reads as white space; stripped, it was shorter than 32 bytes and refused, and
    no replica ever served (a CI failure)."""
    text = stored.strip()
    if text.isascii() and text.decode("ascii").isprintable():
        return text
    return stored


class GangKey:
    """The one gang key of a release, kept in Secret `name` of `namespace`. `key` is b"" until `load()`."""

    def __init__(self, core_api: Any, namespace: str, name: str, *, create: bool = True,
                 say: Callable[[str], None] = log.warning) -> None:
        self.core, self.namespace, self.name, self.create, self.say = core_api, namespace, name, create, say
        self.key = b""

    @property
    def where(self) -> str:
        return f"Secret {self.namespace}/{self.name}"

    # --- the Secret -----------------------------------------------------------------------------------------------

    def _read(self) -> bytes | None:
        """The key in the Secret; None when the Secret does not exist. GangKeyError when it holds no usable key."""
        from kubernetes.client.rest import ApiException
        try:
            secret = json.loads(self.core.read_namespaced_secret(self.name, self.namespace,
                                                                 _preload_content=False).data)
        except ApiException as e:
            if e.status == 404:
                return None
            raise GangKeyError(self._refused("read", e)) from e
        value = (secret.get("data") or {}).get(DATA_KEY)
        if not value:
            raise GangKeyError(f"{self.where} has no key {DATA_KEY!r}: put at least {MIN_BYTES} random bytes there "
                               f"(e.g. --from-literal={DATA_KEY}=$(openssl rand -hex 32))")
        try:
            key = key_bytes(base64.b64decode(value, validate=True))
        except (binascii.Error, ValueError) as e:
            raise GangKeyError(f"{self.where}: {DATA_KEY!r} is not base64 ({e})") from e
        if len(key) < MIN_BYTES:
            raise GangKeyError(f"{self.where}: {DATA_KEY!r} holds {len(key)} bytes, fewer than {MIN_BYTES}: put at "
                               f"least {MIN_BYTES} random bytes there (e.g. $(openssl rand -hex 32))")
        return key

    def _create(self, key: bytes) -> bytes:
        """Create the Secret holding `key`; the key in the Secret afterwards (another replica's when it won)."""
        from kubernetes.client.rest import ApiException
        body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": self.name, "namespace": self.namespace,
                             "labels": {"app.kubernetes.io/managed-by": MANAGED_BY,
                                        "app.kubernetes.io/part-of": "trainhook"},
                             "annotations": {"trainhook.dev/kept-on-uninstall": "the gang key: delete it by hand "
                                             "to make a new one (every running gang then loses its members' trust)"}},
                "data": {DATA_KEY: base64.b64encode(key).decode()}}
        try:
            self.core.create_namespaced_secret(self.namespace, body, _preload_content=False)
            log.info("gang key created", extra={"secret": self.name, "fingerprint": fingerprint(key)})
            return key
        except ApiException as e:
            if e.status != 409:
                raise GangKeyError(self._refused("create", e)) from e
        theirs = self._read()  # another replica created it first: theirs is the key
        if theirs is None:
            raise GangKeyError(f"{self.where} was created by someone else and deleted again at once; retrying")
        return theirs

    def _refused(self, verb: str, error: Any) -> str:
        if error.status == 403:
            grant = "create Secrets in its namespace and get this one" if self.create else "get this one Secret"
            return (f"cannot {verb} {self.where} (403 forbidden): the webhook's ServiceAccount must {grant} "
                    f"(the chart's Role <fullname>-gang-key grants it)")
        return f"cannot {verb} {self.where}: HTTP {error.status} {error.reason}"

    # --- what the server calls ------------------------------------------------------------------------------------

    def load(self) -> bytes:
        """The key every replica shares: read it, or create it when there is none (and we may). Raises
        GangKeyError naming the Secret and the fix."""
        key = self._read()
        if key is None:
            if not self.create:
                raise GangKeyError(f"{self.where} does not exist: create it (key {DATA_KEY!r}, at least {MIN_BYTES} "
                                   f"random bytes) or unset gangKey.existingSecret so that the webhook makes one")
            key = self._create(secrets.token_bytes(NEW_KEY_BYTES))
        self.key = key
        log.info("gang key loaded", extra={"secret": self.name, "fingerprint": fingerprint(key)})
        return key

    def refresh(self) -> bool:
        """Look at the Secret again; True when the key changed (adopted). A vanished Secret is made again with the
        key held here, so replicas that hold it keep agreeing. Errors are GangKeyError (the key held stays)."""
        current = self._read()
        if current is None:
            if not self.create:
                raise GangKeyError(f"{self.where} does not exist any more; serving with the key read before")
            current = self._create(self.key)
        if current == self.key:
            return False
        self.say(f"the gang key in {self.where} changed (fingerprint {fingerprint(self.key)} -> "
                 f"{fingerprint(current)}); serving with the new one")
        self.key = current
        return True

    async def start(self, retry_max: float = 10.0) -> bytes:
        """`load()` until it succeeds, saying why each time it does not (the server does not serve meanwhile)."""
        delay = 0.5
        while True:
            try:
                return await asyncio.to_thread(self.load)
            except GangKeyError as e:
                self.say(f"no gang key yet, not serving: {e}")
            except Exception as e:  # noqa: BLE001 - the API client's connection errors: retried
                self.say(f"no gang key yet, not serving: {type(e).__name__}: {e}")
            await asyncio.sleep(delay)
            delay = min(delay * 2, retry_max)

    async def keep(self, interval: float, adopted: Callable[[bytes], None]) -> None:
        """`refresh()` every `interval` seconds forever; `adopted(key)` when the key changed."""
        while True:
            await asyncio.sleep(interval)
            try:
                if await asyncio.to_thread(self.refresh):
                    adopted(self.key)
            except Exception as e:  # noqa: BLE001 - logged; the key held stays in use
                self.say(f"cannot look at the gang key again: {e}")
