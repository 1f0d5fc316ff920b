"""Bearer-token authentication for the admin API, as pure ASGI middleware (STYLE C16)."""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from control_plane.api.http_errors import from_error
from control_plane.errors import UnauthorizedError

__all__ = ["BearerAuth"]

_PREFIX = b"bearer "


class BearerAuth:
    """Answer 401 unless ``Authorization: Bearer <token>`` carries the admin token.

    Only paths under ``protected_prefix`` are checked, except those in ``public_paths``
    (the OpenAPI document). The comparison takes the same time whatever the guess.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str,
        protected_prefix: str = "/admin/v1",
        public_paths: frozenset[str] = frozenset(),
    ) -> None:
        if not token:
            raise ValueError("the admin token must not be empty")
        self._app = app
        self._token = token.encode("utf-8")
        self._prefix = protected_prefix
        self._public = public_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        path: str = scope["path"]
        if not path.startswith(self._prefix) or path in self._public:
            await self._app(scope, receive, send)
            return
        reason = self._check(scope)
        if reason is not None:
            await from_error(UnauthorizedError(reason=reason))(scope, receive, send)
            return
        await self._app(scope, receive, send)

    def _check(self, scope: Scope) -> str | None:
        """None when the token is right, else why not."""
        header = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                header = value
                break
        if header is None:
            return "missing bearer token: send 'Authorization: Bearer <admin token>'"
        if not header[: len(_PREFIX)].lower() == _PREFIX:
            return "the Authorization header must use the Bearer scheme"
        given = header[len(_PREFIX) :].strip()
        if not hmac.compare_digest(given, self._token):
            return "wrong admin token"
        return None
