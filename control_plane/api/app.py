"""The admin API's ASGI application factory."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Collection, Sequence
from typing import Protocol, TypedDict

from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response

from control_plane.api import http_errors, routes
from control_plane.api.auth import BearerAuth
from control_plane.api.console.guard import ConsoleGuard
from control_plane.api.console.routes import ConsoleState, console_routes, create_templates
from control_plane.api.console.session import SessionKeys
from control_plane.api.console.stats import RequestHistory
from control_plane.api.openapi import openapi_document
from control_plane.api.service import AdminService
from control_plane.errors import ConflictError, ControlPlaneUnavailableError
from control_plane.keys import KeyService
from control_plane.store.base import StoreConflictError
from control_plane.store.errors import StoreUnavailableError
from foundation.errors import ZeroserveError

__all__ = ["Acting", "AdminState", "OPENAPI_PATH", "WorkerMetricsSource", "create_app"]

OPENAPI_PATH = "/admin/v1/openapi.json"


class Acting(Protocol):
    @property
    def is_acting(self) -> bool: ...


class WorkerMetricsSource(Protocol):
    async def exposition(self, exclude: Collection[str] = ()) -> str: ...


class AdminState(TypedDict):
    """What the lifespan hands to every request (``request.state.<key>``)."""

    service: AdminService
    keys: KeyService
    registry: CollectorRegistry
    acting: Acting
    allowed_storage: tuple[str, ...]
    allow_model_code: bool
    openapi: dict[str, object]
    worker_metrics: WorkerMetricsSource | None
    console: ConsoleState


async def _store_unavailable(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StoreUnavailableError)
    error = ControlPlaneUnavailableError(f"the state store is unavailable: {exc.reason}")
    return await http_errors.handle_zeroserve_error(request, error)


async def _store_conflict(request: Request, exc: Exception) -> Response:
    return http_errors.from_error(ConflictError(str(exc)))


def create_app(
    service: AdminService,
    *,
    token: str,
    registry: CollectorRegistry,
    acting: Acting,
    allowed_storage: Sequence[str],
    allow_model_code: bool = False,
    worker_metrics: WorkerMetricsSource | None = None,
    request_metrics: CollectorRegistry | None = None,
    console_session_s: float = 12 * 3600.0,
    keys: KeyService | None = None,
) -> Starlette:
    """The admin app over ``service``; every ``/admin/v1`` path but the OpenAPI document
    needs ``Authorization: Bearer <token>``. ``/metrics`` and ``/healthz`` are open (the
    admin port binds to loopback unless told otherwise). ``/console`` is the web console: a
    login with the same token opens a session of ``console_session_s``; its request rates
    and latencies come from ``request_metrics`` (an in-process activator's registry), and
    are not shown without it. ``allow_model_code`` False refuses registrations whose
    backend, platform or config make the model code. ``worker_metrics``,
    where given, adds the workers' families to ``/metrics`` after the registry's. ``keys``
    manages the API keys (``/admin/v1/keys``); by default over the service's store."""
    key_service = keys or KeyService(service.store)
    document = openapi_document()
    sessions = SessionKeys(token, lifetime_s=console_session_s)
    templates = create_templates()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[AdminState]:
        history = sampler = None
        if request_metrics is not None:
            history = RequestHistory(request_metrics)
            sampler = asyncio.create_task(history.run(), name="console-request-history")
        try:
            yield AdminState(
                service=service,
                keys=key_service,
                registry=registry,
                acting=acting,
                allowed_storage=tuple(allowed_storage),
                allow_model_code=allow_model_code,
                openapi=document,
                worker_metrics=worker_metrics,
                console=ConsoleState(keys=sessions, history=history, templates=templates),
            )
        finally:
            if sampler is not None:
                sampler.cancel()
                await asyncio.gather(sampler, return_exceptions=True)
            await service.close()

    # Authentication first, so that nothing runs for a request without the token or a
    # console session (not even body parsing). Each guards its own prefix only.
    middleware = [
        Middleware(BearerAuth, token=token, public_paths=frozenset({OPENAPI_PATH})),
        Middleware(ConsoleGuard, keys=sessions),
    ]
    return Starlette(
        routes=[*routes.routes, *console_routes()],
        middleware=middleware,
        lifespan=lifespan,
        exception_handlers={
            ZeroserveError: http_errors.handle_zeroserve_error,
            StoreUnavailableError: _store_unavailable,
            StoreConflictError: _store_conflict,
            HTTPException: http_errors.handle_http_exception,
            Exception: http_errors.handle_unexpected,
        },
    )
