"""An HTTP listener for tests: a real uvicorn server on a free loopback port."""

from __future__ import annotations

from typing import Any

from starlette.types import ASGIApp

from foundation.http import ServerLimits
from foundation.serving import HttpListener, bind_socket

WAIT_S = 30.0
"""Each bound of the listener (drain, start; the whole stop twice that)."""


def loopback_listener(app: ASGIApp, **options: Any) -> HttpListener:
    """A listener serving ``app`` under default limits; ``options`` are HttpListener's
    (``direct=``) or uvicorn's."""
    return HttpListener(
        app,
        ServerLimits(),
        bind_socket("127.0.0.1", 0),
        name="test",
        drain_timeout_s=WAIT_S,
        start_timeout_s=WAIT_S,
        stop_timeout_s=2 * WAIT_S,
        **options,
    )
