"""API keys and quotas on the activator's HTTP paths, as pure ASGI middleware.

Every path but the open ones (health, server metadata, ``/metrics``: load balancers,
kubelets and Prometheus call them without a key) passes :meth:`Gate.admit` before any of
the request is read. An accepted request carries, in its scope's state, ``key_id`` (the
key's public id, for the access log) and its :class:`~activator.gate.Pass` (for the routes'
model checks); its in-flight place is given back when the answer has been sent, streamed
answers included. Refusals take OpenAI's error body on ``/v1`` paths.
"""

from __future__ import annotations

from typing import Final

from starlette.types import ASGIApp, Receive, Scope, Send

from activator.gate import Gate, Pass
from activator.http_errors import from_error, openai_from_error
from foundation.errors import ZeroserveError

__all__ = ["OPEN_PATHS", "KeyAuth", "admitted"]

OPEN_PATHS: Final = frozenset({"/v2/health/live", "/v2/health/ready", "/v2", "/metrics"})

_PASS = "gate_pass"
_ANONYMOUS = Pass(None)


def admitted(scope: Scope) -> Pass:
    """The pass :class:`KeyAuth` gave this request (anonymous with auth off)."""
    state = scope.get("state")
    if state is None:
        return _ANONYMOUS
    found: Pass = state.get(_PASS, _ANONYMOUS)
    return found


class KeyAuth:
    """Refuses a model request without a valid key (401) or over its key's rate or
    in-flight limit (429) before the app sees it."""

    def __init__(self, app: ASGIApp, *, gate: Gate) -> None:
        self._app = app
        self._gate = gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self._gate.is_enabled or scope["path"] in OPEN_PATHS:
            await self._app(scope, receive, send)
            return
        header: str | None = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                header = value.decode("latin-1")
                break
        try:
            admission = await self._gate.admit(header)
        except ZeroserveError as exc:
            is_openai = scope["path"].startswith("/v1/")
            response = openai_from_error(exc) if is_openai else from_error(exc)
            await response(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        state["key_id"] = admission.key_id
        state[_PASS] = admission
        try:
            await self._app(scope, receive, send)
        finally:
            admission.release()
