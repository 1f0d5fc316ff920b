"""The activator's ASGI application factory."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Protocol

from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware

from activator import http_errors
from activator.buffer import Activate, Buffer
from activator.health import StallPolicy
from activator.metrics import ActivatorMetrics, BufferDepthCollector, RequestMetricsMiddleware
from activator.placements import (
    ModelCatalog,
    ModelSource,
    PlacementSource,
    PlacementView,
    ReplicaTable,
)
from activator.proxy import Proxy
from activator.routes import routes
from activator.settings import ActivatorSettings
from activator.state import ActivatorState, Lifecycle
from activator.traffic import Traffic, TrafficSink
from activator.upstream import UpstreamPool, UpstreamTimeouts
from activator.watch import ReplicaWatch, probe_live
from foundation.cloudwatch import CloudWatchPublisher, PutMetricDataSink
from foundation.errors import ZeroserveError
from foundation.http import handle_http_exception, handle_unexpected

logger = logging.getLogger(__name__)

_WATCH_TICK_S = 0.25
"""How often the replica watch looks for stalled workers: a fraction of the stall setting's
second, at the cost of summing the routing table's counters."""


class ActivatorStore(PlacementSource, ModelSource, TrafficSink, Protocol):
    """What the activator needs of the state store; ``StateStore`` has all of it."""


def create_app(
    settings: ActivatorSettings,
    store: ActivatorStore,
    activate: Activate,
    activator_id: str,
    *,
    lifecycle: Lifecycle | None = None,
    registry: CollectorRegistry | None = None,
) -> Starlette:
    """The activator app. Its lifespan builds the replica table, buffer, catalog, traffic
    counter and the upstream connection pool, follows the store's placements, reports
    traffic and watches for stalled workers in the background, and at shutdown fails what
    still waits, stops those tasks, sends a last traffic report and closes the pool.

    Parameters:
        settings: the activator's settings.
        store: placements, registered models, and where traffic reports go.
        activate: asks the control plane to bring a model up (``store.request_activation``
            in a cluster).
        activator_id: names this activator in traffic reports.
        lifecycle: shared with the server, which marks it stopping on a signal.
        registry: where the activator's metrics live (``/metrics``); a new one when None.
    """
    lifecycle = lifecycle or Lifecycle()
    publisher = None
    if settings.cloudwatch_enabled:
        publisher = CloudWatchPublisher(
            PutMetricDataSink(),
            flush_interval_s=settings.cloudwatch_flush_interval_s,
            max_values=settings.cloudwatch_max_values,
        )
    metrics = ActivatorMetrics(registry or CollectorRegistry(), observer=publisher)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[ActivatorState]:
        table = ReplicaTable()
        buffer = Buffer(
            activate,
            table,
            max_requests=settings.buffer_max_requests,
            release_concurrency=settings.release_concurrency,
            activation_timeout_s=settings.activation_timeout_s,
            retry_after_s=settings.retry_after_s,
        )
        view = PlacementView(
            store,
            table,
            buffer,
            quarantine_s=settings.replica_quarantine_s,
            resubscribe_delay_s=settings.resubscribe_delay_s,
        )
        catalog = ModelCatalog(
            store,
            ttl_s=settings.model_cache_ttl_s,
            max_entries=settings.model_cache_max_entries,
            retry_after_s=settings.retry_after_s,
        )
        traffic = Traffic(store, activator_id, interval_s=settings.traffic_report_interval_s)
        pool = UpstreamPool(
            UpstreamTimeouts(
                connect_s=settings.upstream_connect_timeout_s,
                read_s=settings.upstream_read_timeout_s,
                write_s=settings.upstream_write_timeout_s,
                pool_s=settings.upstream_pool_timeout_s,
            ),
            max_connections=settings.upstream_max_connections,
            max_idle_connections=settings.upstream_max_keepalive_connections,
            idle_expiry_s=settings.upstream_keepalive_expiry_s,
        )
        proxy = Proxy(
            pool,
            table,
            view,
            buffer,
            traffic,
            read_timeout_s=settings.upstream_read_timeout_s,
            activation_timeout_s=settings.activation_timeout_s,
            retry_after_s=settings.retry_after_s,
        )
        watch = ReplicaWatch(
            table,
            view,
            probe_live,
            StallPolicy(
                stall_after_s=settings.upstream_stall_s,
                probe_interval_s=settings.upstream_probe_interval_s,
            ),
            probe_timeout_s=settings.upstream_probe_timeout_s,
            tick_s=_WATCH_TICK_S,
            observer=metrics,
        )
        tasks = [
            asyncio.create_task(view.run(), name="activator-placements"),
            asyncio.create_task(traffic.run(), name="activator-traffic"),
            asyncio.create_task(watch.run(), name="activator-replica-watch"),
        ]
        if publisher is not None:
            tasks.append(asyncio.create_task(publisher.run(), name="activator-cloudwatch"))
        depth = BufferDepthCollector(buffer.depths)
        metrics.registry.register(depth)  # unregistered below: the app may start again
        try:
            await view.wait_synced(settings.startup_sync_timeout_s)
            yield ActivatorState(
                settings=settings,
                catalog=catalog,
                proxy=proxy,
                view=view,
                lifecycle=lifecycle,
                metrics=metrics,
            )
        finally:
            lifecycle.is_stopping = True
            await buffer.close()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await watch.close()
            view.close()
            await traffic.flush()
            await pool.aclose()
            if publisher is not None:
                await publisher.close()
            metrics.registry.unregister(depth)

    # Outermost first; access logging and request ids will go here too, as pure ASGI. The
    # metrics middleware sits inside Starlette's outermost error middleware and outside the
    # exception handlers, so it sees the status those handlers answer with.
    middleware = [Middleware(RequestMetricsMiddleware, metrics=metrics)]
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
