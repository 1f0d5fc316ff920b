"""A data plane over a model repository, in process: through its HTTP app (its lifespan
run explicitly, requests through httpx's ASGI transport), or as its handlers alone."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.types import Receive, Scope, Send

from data_plane.app import build_node_cache, build_repository, create_app, load_startup_models
from data_plane.handlers import Handlers
from data_plane.metrics import Metrics
from data_plane.repository import ModelRepository
from data_plane.settings import DataPlaneSettings, ModelControlMode
from data_plane.state import Lifecycle, is_explicit
from data_plane.storage import NodeCache


def _settings(
    repo: Path,
    cache_dir: Path,
    *,
    mode: ModelControlMode,
    load_models: tuple[str, ...],
    allowed_storage: tuple[str, ...],
    exit_timeout_s: float = 5.0,
    **overrides: Any,
) -> DataPlaneSettings:
    return DataPlaneSettings(
        model_repository=str(repo),
        model_control_mode=mode,
        load_models=load_models,
        cache_dir=cache_dir,
        allowed_storage=allowed_storage,
        gpu_count=0,
        exit_timeout_s=exit_timeout_s,
        **overrides,
    )


def app_for(
    repo: Path,
    cache_dir: Path,
    *,
    mode: ModelControlMode = ModelControlMode.EXPLICIT,
    load_models: tuple[str, ...] = (),
    allowed_storage: tuple[str, ...] = (),
    **overrides: Any,
) -> tuple[Starlette, DataPlaneSettings]:
    """The data plane's app serving ``repo`` and its settings, nothing started (its
    lifespan loads the start-up models); ``overrides`` are more settings."""
    settings, metrics, cache, repository = _parts(
        repo,
        cache_dir,
        mode=mode,
        load_models=load_models,
        allowed_storage=allowed_storage,
        **overrides,
    )
    return create_app(settings, repository, cache, metrics), settings


def _parts(
    repo: Path, cache_dir: Path, **settings_fields: Any
) -> tuple[DataPlaneSettings, Metrics, NodeCache, ModelRepository]:
    """The settings (`_settings` with ``settings_fields``) and what a data plane builds
    from them: its metrics, node cache and repository."""
    settings = _settings(repo, cache_dir, **settings_fields)
    metrics = Metrics()
    cache = build_node_cache(settings, metrics)
    return settings, metrics, cache, build_repository(settings, metrics, cache, gpu_count=0)


@contextlib.asynccontextmanager
async def data_plane(
    repo: Path,
    cache_dir: Path,
    *,
    mode: ModelControlMode = ModelControlMode.EXPLICIT,
    load_models: tuple[str, ...] = (),
    allowed_storage: tuple[str, ...] = (),
    outer_middleware: Sequence[Middleware] = (),
    **overrides: Any,
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the data plane serving ``repo`` (start-up loads done, as a server would
    have them before it answers); everything is shut down on exit. ``outer_middleware`` go
    at the top of the app's middleware stack; ``overrides`` are more settings
    (``server_id``, ``repository_poll_s``...)."""
    app, _ = app_for(
        repo,
        cache_dir,
        mode=mode,
        load_models=load_models,
        allowed_storage=allowed_storage,
        **overrides,
    )
    app.user_middleware[:0] = outer_middleware  # the stack is built at the first request
    async with app.router.lifespan_context(app) as state:

        async def with_state(scope: Scope, receive: Receive, send: Send) -> None:
            scope["state"] = dict(state or {})
            await app(scope, receive, send)

        transport = httpx.ASGITransport(app=with_state)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://data-plane", timeout=60.0
        ) as client:
            yield client


@dataclass
class Core:
    """A data plane without a transport: its handlers and what they work on."""

    handlers: Handlers
    repository: ModelRepository
    lifecycle: Lifecycle
    metrics: Metrics


@contextlib.asynccontextmanager
async def data_plane_core(
    repo: Path,
    cache_dir: Path,
    *,
    mode: ModelControlMode = ModelControlMode.EXPLICIT,
    load_models: tuple[str, ...] = (),
    allowed_storage: tuple[str, ...] = (),
    exit_timeout_s: float = 5.0,
) -> AsyncIterator[Core]:
    """The handlers of a data plane serving ``repo``, start-up loads done; every model is
    unloaded and the node cache closed on exit. ``exit_timeout_s`` bounds each drain."""
    settings, metrics, cache, repository = _parts(
        repo,
        cache_dir,
        mode=mode,
        load_models=load_models,
        allowed_storage=allowed_storage,
        exit_timeout_s=exit_timeout_s,
    )
    lifecycle = Lifecycle()
    handlers = Handlers.create(repository, lifecycle, metrics, is_explicit=is_explicit(settings))
    try:
        await load_startup_models(settings, repository)
        yield Core(handlers, repository, lifecycle, metrics)
    finally:
        try:
            await repository.close()
        finally:
            handlers.close()
            await cache.close()
