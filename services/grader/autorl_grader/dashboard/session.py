"""Dashboard sessions: an opaque, signed cookie value that is neither the admin token nor a hash of it.

A session is ``v1.<nonce>.<expiry>.<mac>``: a random nonce and an expiry signed with a key derived
from the admin token. Every grader replica holding the same admin token accepts it (no shared session
store), rotating the admin token ends every session, and a signed-out nonce is refused by the replica
that signed it out until it expires anyway.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time

COOKIE_NAME = "__Host-autorl_session"
#: How long a sign-in lasts, in seconds.
SESSION_TTL_S = 12 * 3600
_VERSION = "v1"
_KEY_CONTEXT = b"autorl dashboard session v1"


def _mac(key: bytes, nonce: str, expiry: int) -> str:
    return hmac.new(key, f"{_VERSION}.{nonce}.{expiry}".encode(), hashlib.sha256).hexdigest()


class SessionSigner:
    """Issues and checks session values for one admin token."""

    def __init__(self, admin_token: str, *, ttl_s: int = SESSION_TTL_S) -> None:
        self._admin_token = admin_token.encode()
        self._key = hmac.new(self._admin_token, _KEY_CONTEXT, hashlib.sha256).digest()
        self.ttl_s = ttl_s
        self._revoked: dict[str, int] = {}
        self._lock = threading.Lock()

    def is_admin_token(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self._admin_token)

    def issue(self, now: float | None = None) -> str:
        nonce = secrets.token_urlsafe(24)
        expiry = int(now if now is not None else time.time()) + self.ttl_s
        return f"{_VERSION}.{nonce}.{expiry}.{_mac(self._key, nonce, expiry)}"

    def _parse(self, value: str, now: float) -> tuple[str, int] | None:
        parts = value.split(".")
        if len(parts) != 4 or parts[0] != _VERSION or not parts[2].isdigit():
            return None
        _, nonce, expiry_text, mac = parts
        expiry = int(expiry_text)
        if not hmac.compare_digest(mac.encode(), _mac(self._key, nonce, expiry).encode()):
            return None
        if expiry <= now:
            return None
        return nonce, expiry

    def verify(self, value: str | None, now: float | None = None) -> bool:
        if not value:
            return False
        moment = now if now is not None else time.time()
        parsed = self._parse(value, moment)
        if parsed is None:
            return False
        with self._lock:
            return parsed[0] not in self._revoked

    def revoke(self, value: str | None, now: float | None = None) -> None:
        moment = now if now is not None else time.time()
        parsed = self._parse(value or "", moment)
        if parsed is None:
            return
        with self._lock:
            # Expired nonces no longer need remembering: their signature check fails by itself.
            self._revoked = {n: e for n, e in self._revoked.items() if e > moment}
            self._revoked[parsed[0]] = parsed[1]
