"""The console's ASGI middleware: security headers on every console answer, and no page
or change without a session."""

from __future__ import annotations

import time
from collections.abc import Callable

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from control_plane.api.console.session import SessionKeys

__all__ = ["COOKIE", "CONSOLE_PREFIX", "LOGIN_CHECK", "ConsoleGuard", "SECURITY_HEADERS"]

CONSOLE_PREFIX = "/console"
COOKIE = "zeroserve_console"
"""The session cookie's name."""

SECURITY_HEADERS = {
    # Every script and style is a file under /console/static: no inline code, no other
    # origin, and no framing (clickjacking of the buttons that change things).
    "content-security-policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    # same-origin, not no-referrer: with no-referrer a browser sends "Origin: null" on
    # the console's own forms, which the origin check must refuse.
    "referrer-policy": "same-origin",
    "cross-origin-opener-policy": "same-origin",
}

LOGIN_CHECK = "/console/login/check"
"""Where a login redirects: it checks the browser kept the session cookie."""

_PUBLIC = ("/console/login", LOGIN_CHECK)
_STATIC = "/console/static/"


class ConsoleGuard:
    """For paths under ``/console``: adds ``SECURITY_HEADERS`` (and ``no-store`` to all but
    static files), and answers a request without a valid session itself: a page with a
    redirect to the login form, anything else with 401. Other paths pass untouched."""

    def __init__(
        self, app: ASGIApp, *, keys: SessionKeys, wall: Callable[[], float] = time.time
    ) -> None:
        self._app = app
        self._keys = keys
        self._wall = wall

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        if scope["type"] != "http" or not (
            path == CONSOLE_PREFIX or path.startswith(CONSOLE_PREFIX + "/")
        ):
            await self._app(scope, receive, send)
            return
        is_static = path.startswith(_STATIC)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers[name] = value
                if not is_static:
                    headers["cache-control"] = "no-store"
            await send(message)

        if scope["method"] not in ("GET", "HEAD") and not _is_same_origin(scope):
            # Beside the CSRF token and SameSite: a browser names the page a form came from.
            forbidden = PlainTextResponse("cross-origin form refused", status_code=403)
            await forbidden(scope, receive, send_with_headers)
            return
        is_public = path in _PUBLIC or is_static
        if not is_public:
            cookie = Request(scope).cookies.get(COOKIE)
            if not self._keys.is_valid(cookie, self._wall()):
                refuse: Response
                if scope["method"] in ("GET", "HEAD") and not path.endswith("/follow"):
                    refuse = RedirectResponse("/console/login", status_code=303)
                else:
                    refuse = PlainTextResponse("log in to the console first", status_code=401)
                await refuse(scope, receive, send_with_headers)
                return
        await self._app(scope, receive, send_with_headers)


def _is_same_origin(scope: Scope) -> bool:
    """False only when the request names an ``Origin`` other than the host it was sent to."""
    origin: str | None = None
    host: str | None = None
    for name, value in scope["headers"]:
        if name == b"origin":
            origin = value.decode("latin-1")
        elif name == b"host":
            host = value.decode("latin-1")
    if origin is None:
        return True
    return origin.partition("://")[2] == host
