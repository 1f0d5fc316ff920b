"""The activator's public HTTP server, the same standalone and in ``zeroserve up``."""

from __future__ import annotations

import socket

from starlette.types import ASGIApp

from activator.settings import ActivatorSettings
from foundation.serving import HttpListener


def create_server(
    app: ASGIApp,
    settings: ActivatorSettings,
    sock: socket.socket,
    *,
    start_timeout_s: float | None = None,
    stop_timeout_s: float | None = None,
) -> HttpListener:
    """The listener serving ``app`` on ``sock`` (bound to ``settings.host:settings.port``
    by the caller, before anything else starts); the bounds are `HttpListener`'s."""
    return HttpListener(
        app,
        settings,
        sock,
        name="activator",
        drain_timeout_s=settings.exit_timeout_s,
        start_timeout_s=start_timeout_s,
        stop_timeout_s=stop_timeout_s,
        # The workers' Date and Server headers pass through; uvicorn must not add its own.
        server_header=False,
        date_header=False,
    )
