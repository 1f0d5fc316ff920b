"""The activator's ASGI application factory."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware

from activator import http_errors
from activator.access_log import AccessLogMiddleware, RequestIdMiddleware
from activator.auth import KeyAuth
from activator.buffer import Activate
from activator.core import ActivatorCore, ActivatorStore
from activator.metrics import RequestMetricsMiddleware
from activator.quotas import SharedCounters
from activator.routes import routes
from activator.settings import ActivatorSettings
from activator.state import ActivatorState, Lifecycle
from foundation.errors import ZeroserveError
from foundation.http import handle_http_exception, handle_unexpected

__all__ = ["ActivatorStore", "create_app", "create_app_on"]


def create_app(
    settings: ActivatorSettings,
    store: ActivatorStore,
    activate: Activate,
    activator_id: str,
    *,
    lifecycle: Lifecycle | None = None,
    registry: CollectorRegistry | None = None,
    counters: SharedCounters | None = None,
) -> Starlette:
    """The activator app over a core of its own (see :class:`ActivatorCore` for what its
    lifespan starts and stops, and what the parameters are)."""
    core = ActivatorCore(
        settings,
        store,
        activate,
        activator_id,
        lifecycle=lifecycle,
        registry=registry,
        counters=counters,
    )
    return create_app_on(core)


def create_app_on(core: ActivatorCore) -> Starlette:
    """The activator app over ``core``, which its lifespan opens (sharing it with the
    gRPC listener when one runs beside it)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[ActivatorState]:
        async with core.open() as parts:
            yield ActivatorState(
                settings=parts.settings,
                catalog=parts.catalog,
                proxy=parts.proxy,
                view=parts.view,
                lifecycle=parts.lifecycle,
                metrics=parts.metrics,
                gate=parts.gate,
            )

    # Outermost first, all inside Starlette's outermost error middleware and outside the
    # exception handlers, so that they see the status those handlers answer with (refusals
    # for keys and quotas included). The request id comes first: the access log names it and
    # the proxy passes it on. The access log wraps the metrics so that its latency covers
    # theirs too, and reads the key id the key check (inside both) leaves in the scope. Keys
    # come before anything reads the request.
    middleware = [Middleware(RequestIdMiddleware)]
    if core.access_log is not None:
        middleware.append(Middleware(AccessLogMiddleware, log=core.access_log))
    middleware.append(Middleware(RequestMetricsMiddleware, metrics=core.metrics))
    middleware.append(Middleware(KeyAuth, gate=core.gate))
    return Starlette(
        routes=routes,
        middleware=middleware,
        lifespan=lifespan,
        exception_handlers={
            ZeroserveError: http_errors.handle_zeroserve_error,
            HTTPException: handle_http_exception,
            Exception: handle_unexpected,
        },
    )
