"""Running the activator under uvicorn, with readiness failing before connections stop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from starlette.types import ASGIApp

from activator.settings import ActivatorSettings
from activator.state import Lifecycle
from foundation.http import DrainingServer, http_config

logger = logging.getLogger(__name__)


def create_server(
    app: ASGIApp, settings: ActivatorSettings, lifecycle: Lifecycle
) -> DrainingServer:
    """A uvicorn server for ``app`` on ``settings.host:settings.port``."""
    config = http_config(
        app,
        settings,
        host=settings.host,
        port=settings.port,
        loop="auto",
        lifespan="on",
        access_log=False,
        log_config=None,
        # The workers' Date and Server headers pass through; uvicorn must not add its own.
        server_header=False,
        date_header=False,
        timeout_graceful_shutdown=max(int(settings.exit_timeout_s), 1),
        backlog=2048,
    )
    return DrainingServer(config, lifecycle, settings.readiness_propagation_s)


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where it is installed (what uvicorn's ``loop="auto"`` picks when
    it owns the loop; here ``__main__`` owns it, to open the store on it), else asyncio's."""
    try:
        import uvloop
    except ImportError:  # Windows, or a slim install
        return None
    return uvloop.new_event_loop
