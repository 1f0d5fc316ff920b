"""Running the activator app in tests: in process through ASGI, or under uvicorn on loopback."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.types import ASGIApp, Receive, Scope, Send

from activator.server import create_server
from activator.settings import ActivatorSettings
from foundation.serving import bind_socket
from tests.uvicorn_server import serving

START_TIMEOUT_S = 30.0


@contextlib.asynccontextmanager
async def asgi_client(
    app: Starlette, *, raise_app_exceptions: bool = True
) -> AsyncIterator[httpx.AsyncClient]:
    """A client for ``app`` in process, with its lifespan run explicitly (httpx's ASGI
    transport runs none) and its state put in every scope, as uvicorn does."""
    async with app.router.lifespan_context(app) as state:

        async def with_state(scope: Scope, receive: Receive, send: Send) -> None:
            scope["state"] = dict(state or {})
            await app(scope, receive, send)

        transport = httpx.ASGITransport(app=with_state, raise_app_exceptions=raise_app_exceptions)
        async with httpx.AsyncClient(transport=transport, base_url="http://activator") as client:
            yield client


@contextlib.asynccontextmanager
async def serve_app(app: Starlette, settings: ActivatorSettings) -> AsyncIterator[str]:
    """Serve the activator ``app`` with the production server settings on a free port."""
    sock = bind_socket("127.0.0.1", 0)
    async with create_server(app, settings, sock, start_timeout_s=START_TIMEOUT_S) as server:
        yield server.url


@contextlib.asynccontextmanager
async def serve_asgi(app: ASGIApp) -> AsyncIterator[str]:
    """Serve a plain ASGI ``app`` (a test upstream) without lifespan on a free port."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off", log_config=None)
    async with serving(uvicorn.Server(config)) as url:
        yield url
