"""A data plane in process with start-up trace settings of the test's choosing, reached
through httpx's ASGI transport; the app's lifespan runs as a server's would, so leaving the
block drains the models and writes out the traces."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from starlette.types import Receive, Scope, Send

from data_plane.app import build_node_cache, build_repository, create_app
from data_plane.metrics import Metrics
from data_plane.settings import DataPlaneSettings


@contextlib.asynccontextmanager
async def traced_data_plane(
    repo: Path, cache_dir: Path, **trace_settings: Any
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the data plane serving every model in ``repo``, with ``trace_settings``
    (``trace_file=...``, ``trace_level=("TIMESTAMPS",)``...) as its start-up settings."""
    settings = DataPlaneSettings(
        model_repository=str(repo),
        cache_dir=cache_dir,
        gpu_count=0,
        exit_timeout_s=5.0,
        **trace_settings,
    )
    async with data_plane_client(settings) as client:
        yield client


@contextlib.asynccontextmanager
async def data_plane_client(settings: DataPlaneSettings) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the data plane that ``settings`` describe, served in process."""
    metrics = Metrics()
    cache = build_node_cache(settings, metrics)
    repository = build_repository(settings, metrics, cache, gpu_count=0)
    app = create_app(settings, repository, cache, metrics)
    async with app.router.lifespan_context(app) as state:

        async def with_state(scope: Scope, receive: Receive, send: Send) -> None:
            scope["state"] = dict(state or {})
            await app(scope, receive, send)

        transport = httpx.ASGITransport(app=with_state)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://data-plane", timeout=60.0
        ) as client:
            yield client
