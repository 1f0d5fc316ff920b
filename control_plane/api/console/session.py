"""Console sessions: a signed, expiring cookie and the CSRF token derived from it.

Nothing is kept on the server: a session is ``<expiry>.<nonce>.<mac>``, where the MAC is an
HMAC-SHA256 over the expiry and nonce under a key derived from the admin token. Any
control-plane replica that knows the token can check it, and changing the token ends every
session. The CSRF token of a session is another HMAC of the whole cookie, so a page can
only carry one for the session it was rendered in, and a forged form from another site
(which cannot read the page) cannot.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

__all__ = ["SessionKeys"]

_COOKIE_CONTEXT = b"zeroserve console session v1"
_CSRF_CONTEXT = b"zeroserve console csrf v1"


class SessionKeys:
    """Issues and checks console sessions for one admin token.

    Parameters:
        token: the admin token; logging in means giving it.
        lifetime_s: how long a session lasts from login.
    """

    def __init__(self, token: str, *, lifetime_s: float) -> None:
        if not token:
            raise ValueError("the admin token must not be empty")
        self._token = token.encode("utf-8")
        self._key = hmac.new(self._token, _COOKIE_CONTEXT, hashlib.sha256).digest()
        self.lifetime_s = lifetime_s

    def is_admin_token(self, given: str) -> bool:
        """Whether ``given`` is the admin token (in time independent of the guess)."""
        return hmac.compare_digest(given.encode("utf-8"), self._token)

    def issue(self, now: float) -> str:
        """A new session cookie value, valid until ``now + lifetime_s``."""
        body = f"{int(now + self.lifetime_s)}.{secrets.token_urlsafe(16)}"
        return f"{body}.{self._mac(body)}"

    def is_valid(self, cookie: str | None, now: float) -> bool:
        """Whether ``cookie`` is a session this token issued and it has not expired."""
        if not cookie or cookie.count(".") != 2:
            return False
        body, _, mac = cookie.rpartition(".")
        if not hmac.compare_digest(mac, self._mac(body)):
            return False
        expiry = body.partition(".")[0]
        return expiry.isdigit() and int(expiry) > now

    def csrf_token(self, cookie: str) -> str:
        """The CSRF token every change made in the session ``cookie`` must carry."""
        return hmac.new(self._key, _CSRF_CONTEXT + cookie.encode(), hashlib.sha256).hexdigest()

    def is_csrf_valid(self, cookie: str | None, given: str | None) -> bool:
        if not cookie or not given:
            return False
        return hmac.compare_digest(given, self.csrf_token(cookie))

    def _mac(self, body: str) -> str:
        return hmac.new(self._key, body.encode(), hashlib.sha256).hexdigest()
