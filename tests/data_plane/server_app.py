"""A data plane over a model repository, in process: its lifespan run explicitly, requests
through httpx's ASGI transport."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
from starlette.types import Receive, Scope, Send

from data_plane.app import build_node_cache, build_repository, create_app
from data_plane.metrics import Metrics
from data_plane.settings import DataPlaneSettings, ModelControlMode


@contextlib.asynccontextmanager
async def data_plane(
    repo: Path,
    cache_dir: Path,
    *,
    mode: ModelControlMode = ModelControlMode.EXPLICIT,
    load_models: tuple[str, ...] = (),
    allowed_storage: tuple[str, ...] = (),
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the data plane serving ``repo`` (start-up loads done, as a server would
    have them before it answers); everything is shut down on exit."""
    settings = DataPlaneSettings(
        model_repository=str(repo),
        model_control_mode=mode,
        load_models=load_models,
        cache_dir=cache_dir,
        allowed_storage=allowed_storage,
        gpu_count=0,
        exit_timeout_s=5.0,
    )
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
