"""The activator's core: what its HTTP app and its gRPC router share while it runs.

One replica table, buffer, placement view, model catalog, traffic counter and upstream
pool per activator, whatever the transport: a model's burst is one burst (one activation)
whether its requests come by HTTP or gRPC, least-outstanding counts see both, and the
autoscaler sees their sum. :class:`ActivatorCore` builds them when it is first opened and
stops them when its last user leaves, so that the HTTP app's lifespan and the gRPC
listener each open it and neither has to know whether the other runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry

from activator.access_log import AccessLog
from activator.buffer import Activate, Buffer
from activator.gate import Gate
from activator.health import StallPolicy
from activator.keys import KeyRing, KeySource
from activator.lb import Replica
from activator.metrics import ActivatorMetrics, BufferDepthCollector
from activator.placements import (
    ModelCatalog,
    ModelSource,
    PlacementSource,
    PlacementView,
    ReplicaListener,
    ReplicaTable,
)
from activator.proxy import Proxy
from activator.quotas import LocalCounters, Quotas, SharedCounters
from activator.sequences import SequenceBindings
from activator.settings import ActivatorSettings
from activator.traffic import Traffic, TrafficSink
from activator.upstream import UpstreamPool, UpstreamTimeouts
from activator.watch import ReplicaWatch, probe_live
from foundation.cloudwatch import CloudWatchPublisher, PutMetricDataSink
from foundation.errors import ModelFailedError
from foundation.records import ModelFailure
from foundation.serving import Lifecycle

__all__ = ["ActivatorCore", "ActivatorStore", "CoreParts", "ReplicaEvents"]

logger = logging.getLogger(__name__)

_WATCH_TICK_S = 0.25
"""How often the replica watch looks for stalled workers: a fraction of the stall setting's
second, at the cost of summing the routing table's counters."""


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ActivatorStore(PlacementSource, ModelSource, TrafficSink, KeySource, Protocol):
    """What the activator needs of the state store; ``StateStore`` has all of it."""


class _NotingFailures:
    """``activate`` that tells the catalog when a model's load failed for good, so that
    its next requests (and readiness) are answered from it at once, not after its cached
    lookup expires."""

    def __init__(self, activate: Activate, catalog: ModelCatalog) -> None:
        self._activate = activate
        self._catalog = catalog

    async def __call__(self, model: str) -> None:
        try:
            await self._activate(model)
        except ModelFailedError as exc:
            self._catalog.note_failure(
                model, ModelFailure(reason=exc.reason, failed_at=exc.failed_at)
            )
            raise


class ReplicaEvents:
    """Tells every subscribed listener when a replica comes or goes: the buffer first (it
    releases waiters), then the others (the gRPC channels, which close a worker's channel
    once it serves nothing here)."""

    def __init__(self, first: ReplicaListener) -> None:
        self._listeners: list[ReplicaListener] = [first]

    def subscribe(self, listener: ReplicaListener) -> None:
        self._listeners.append(listener)

    def unsubscribe(self, listener: ReplicaListener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def replica_added(self, model: str, replica: Replica) -> None:
        for listener in self._listeners:
            listener.replica_added(model, replica)

    def replica_removed(self, model: str, replica: Replica) -> None:
        for listener in self._listeners:
            listener.replica_removed(model, replica)


@dataclass(frozen=True, slots=True)
class CoreParts:
    """The objects of one run of the core, shared by every transport."""

    settings: ActivatorSettings
    lifecycle: Lifecycle
    metrics: ActivatorMetrics
    catalog: ModelCatalog
    table: ReplicaTable
    buffer: Buffer
    view: PlacementView
    traffic: Traffic
    proxy: Proxy
    """The HTTP hop to the workers."""
    pool: UpstreamPool
    """The keep-alive connections to the workers' HTTP ports (the proxy's and gRPC-Web's)."""
    replica_events: ReplicaEvents
    sequences: SequenceBindings
    """Which replica each live sequence runs on (the requests of a sequence stick to it)."""
    gate: Gate
    """API keys and their quotas, for every transport."""


class ActivatorCore:
    """Builds, runs and stops the activator's shared request-path objects.

    The metrics and the access log exist from construction (the HTTP app's middleware
    takes them before it starts); the rest exists while the core is open. :meth:`open` is
    shared: the first caller builds the parts, starts following the store's placements,
    reporting traffic and watching for stalled workers, and waits for the first list of
    placements; later callers get the same parts; when the last one leaves, what still
    waits in the buffer fails, the background tasks stop, a last traffic report goes out
    and the upstream pool closes. It may be opened again after that (a new run, new parts).

    Parameters:
        settings: the activator's settings.
        store: placements, registered models, and where traffic reports go.
        activate: asks the control plane to bring a model up (``store.request_activation``
            in a cluster).
        activator_id: names this activator in traffic reports.
        lifecycle: shared with the servers, which mark it stopping on a signal.
        registry: where the activator's metrics live; a new one when None.
        counters: the quota counters every activator shares (the cluster's Redis); None
            keeps them in this process only.
    """

    def __init__(
        self,
        settings: ActivatorSettings,
        store: ActivatorStore,
        activate: Activate,
        activator_id: str,
        *,
        lifecycle: Lifecycle | None = None,
        registry: CollectorRegistry | None = None,
        counters: SharedCounters | None = None,
    ) -> None:
        self.settings = settings
        self.lifecycle = lifecycle or Lifecycle()
        self._store = store
        self._activate = activate
        self._activator_id = activator_id
        self._publisher: CloudWatchPublisher | None = None
        if settings.cloudwatch_enabled:
            self._publisher = CloudWatchPublisher(
                PutMetricDataSink(),
                flush_interval_s=settings.cloudwatch_flush_interval_s,
                max_values=settings.cloudwatch_max_values,
            )
        self.metrics = ActivatorMetrics(registry or CollectorRegistry(), observer=self._publisher)
        self.access_log = AccessLog(settings.access_log_format) if settings.access_log else None
        """Where both transports write their access-log lines; None when the log is off."""
        ring = None
        if settings.auth == "off" and not _is_loopback(settings.host):
            logger.warning(
                "API keys are OFF (auth=off) and the activator listens on %s: anyone who "
                "reaches it can call every model and start workers. Turn keys on "
                "(ZEROSERVE_ACTIVATOR_AUTH=keys) unless this network is yours alone.",
                settings.host,
            )
        if settings.auth == "keys":
            ring = KeyRing(
                store,
                ttl_s=settings.key_cache_ttl_s,
                max_entries=settings.key_cache_max_entries,
                retry_after_s=settings.retry_after_s,
                resubscribe_delay_s=settings.resubscribe_delay_s,
            )
        self.gate = Gate(
            ring,
            Quotas(
                LocalCounters(max_keys=settings.quota_max_keys),
                counters,
                fallback_s=settings.quota_fallback_s,
                lease_s=settings.activation_timeout_s + settings.upstream_read_timeout_s,
            ),
        )
        """Exists from construction, as the metrics: the HTTP app's middleware takes it."""
        self._parts: CoreParts | None = None
        self._users = 0
        self._stack: contextlib.AsyncExitStack | None = None
        self._lock = asyncio.Lock()

    @property
    def parts(self) -> CoreParts:
        """The parts of the current run; RuntimeError when the core is not open."""
        if self._parts is None:
            raise RuntimeError("the activator core is not open")
        return self._parts

    @contextlib.asynccontextmanager
    async def open(self) -> AsyncIterator[CoreParts]:
        """The core's parts, started by the first of its concurrent users and stopped by
        the last (see the class docstring)."""
        async with self._lock:
            if self._users == 0:
                stack = contextlib.AsyncExitStack()
                self._parts = await stack.enter_async_context(self._run())
                self._stack = stack
            self._users += 1
            parts = self.parts
        try:
            yield parts
        finally:
            async with self._lock:
                self._users -= 1
                if self._users == 0 and self._stack is not None:
                    stack, self._stack = self._stack, None
                    self._parts = None
                    await stack.aclose()

    @contextlib.asynccontextmanager
    async def _run(self) -> AsyncIterator[CoreParts]:
        settings = self.settings
        table = ReplicaTable()
        catalog = ModelCatalog(
            self._store,
            ttl_s=settings.model_cache_ttl_s,
            max_entries=settings.model_cache_max_entries,
            retry_after_s=settings.retry_after_s,
        )
        buffer = Buffer(
            _NotingFailures(self._activate, catalog),
            table,
            max_requests=settings.buffer_max_requests,
            release_concurrency=settings.release_concurrency,
            activation_timeout_s=settings.activation_timeout_s,
            retry_after_s=settings.retry_after_s,
        )
        events = ReplicaEvents(buffer)
        view = PlacementView(
            self._store,
            table,
            events,
            quarantine_s=settings.replica_quarantine_s,
            resubscribe_delay_s=settings.resubscribe_delay_s,
        )
        traffic = Traffic(
            self._store, self._activator_id, interval_s=settings.traffic_report_interval_s
        )
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
        sequences = SequenceBindings(
            idle_s=settings.sequence_idle_s, max_entries=settings.sequence_max_bindings
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
            sequences=sequences,
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
            observer=self.metrics,
        )
        tasks = [
            asyncio.create_task(view.run(), name="activator-placements"),
            asyncio.create_task(traffic.run(), name="activator-traffic"),
            asyncio.create_task(watch.run(), name="activator-replica-watch"),
        ]
        if self._publisher is not None:
            tasks.append(asyncio.create_task(self._publisher.run(), name="activator-cloudwatch"))
        if self.gate.ring is not None:
            tasks.append(asyncio.create_task(self.gate.ring.run(), name="activator-keys"))
        depth = BufferDepthCollector(buffer.depths)
        registry = self.metrics.registry
        registry.register(depth)  # unregistered below: the core may be opened again
        try:
            await view.wait_synced(settings.startup_sync_timeout_s)
            yield CoreParts(
                settings=settings,
                lifecycle=self.lifecycle,
                metrics=self.metrics,
                catalog=catalog,
                table=table,
                buffer=buffer,
                view=view,
                traffic=traffic,
                proxy=proxy,
                pool=pool,
                replica_events=events,
                sequences=sequences,
                gate=self.gate,
            )
        finally:
            self.lifecycle.is_stopping = True
            await buffer.close()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await watch.close()
            view.close()
            await traffic.flush()
            await pool.aclose()
            await self.gate.quotas.close()
            if self._publisher is not None:
                await self._publisher.close()
            registry.unregister(depth)
