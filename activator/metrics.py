"""The activator's metrics: requests, latency and buffer depth per model, on a registry the
caller owns (STYLE C12), recorded by a pure ASGI middleware.

A request is counted under a model only after a route has accepted the name (it is
registered) and said so with :func:`mark_model`; requests for unknown names are not labels,
so random names cannot grow the number of series.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "ActivatorMetrics",
    "BufferDepthCollector",
    "RequestMetricsMiddleware",
    "RequestObserver",
    "mark_model",
    "marked_model",
]

_MODEL_KEY = "zeroserve.model"
"""Where a route leaves the accepted model name in the request's scope."""

_DURATION_BUCKETS_S = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)
"""From a warm replica's milliseconds to a cold start's minutes."""


def mark_model(scope: Scope, model: str) -> None:
    """Count this request under ``model``; call once the name is known to be registered."""
    scope[_MODEL_KEY] = model


def marked_model(scope: Scope) -> str | None:
    """The model :func:`mark_model` named for this request, if any."""
    model: str | None = scope.get(_MODEL_KEY)
    return model


class RequestObserver(Protocol):
    """Told of every answered model request (CloudWatch's publisher, when it is on)."""

    def request_finished(self, *, model: str, status: int, duration_s: float) -> None: ...


class ActivatorMetrics:
    """Requests by model and status code, and their duration, as ``/metrics`` exposes them.

    Parameters:
        registry: where the metrics live.
        observer: also told of every request.
    """

    def __init__(self, registry: CollectorRegistry, observer: RequestObserver | None = None):
        self.registry = registry
        self._observer = observer
        self._children: dict[tuple[str, int], tuple[Any, Any]] = {}
        """(model, status) -> its labelled series: ``labels()`` costs a lock and a lookup on
        every request otherwise. Bounded by registered models times status codes."""
        self.requests = Counter(
            "zeroserve_activator_requests_total",
            "Model requests answered by the activator, by model and HTTP status code "
            "(499: the client closed the connection before its answer, not a server error)",
            ["model", "code"],
            registry=registry,
        )
        self.replica_suspensions = Counter(
            "zeroserve_activator_replica_suspensions_total",
            "Replicas taken out of routing because their worker stopped answering (a liveness "
            "probe after a stall failed), by model",
            ["model"],
            registry=registry,
        )
        self.request_duration = Histogram(
            "zeroserve_activator_request_duration_seconds",
            "Time from a model request's arrival to the end of its response (time spent "
            "buffered during a cold start included)",
            ["model"],
            buckets=_DURATION_BUCKETS_S,
            registry=registry,
        )

    def replicas_suspended(self, models: Iterable[str]) -> None:
        """Count one suspended replica of each of ``models``."""
        for model in models:
            self.replica_suspensions.labels(model).inc()

    def request_finished(self, *, model: str, status: int, duration_s: float) -> None:
        """Record one answered request."""
        children = self._children.get((model, status))
        if children is None:
            children = self._children[model, status] = (
                self.requests.labels(model, str(status)),
                self.request_duration.labels(model),
            )
        children[0].inc()
        children[1].observe(duration_s)
        if self._observer is not None:
            self._observer.request_finished(model=model, status=status, duration_s=duration_s)


class BufferDepthCollector(Collector):
    """``zeroserve_activator_buffered_requests``, read from the buffer at scrape time."""

    def __init__(self, depths: Callable[[], Mapping[str, int]]) -> None:
        self._depths = depths

    def describe(self) -> Iterator[Metric]:
        yield self._family()

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for model, waiting in sorted(self._depths().items()):
            family.add_metric([model], waiting)
        yield family

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "zeroserve_activator_buffered_requests",
            "Requests waiting in the activator's buffer for a replica, per model",
            labels=["model"],
        )


class RequestMetricsMiddleware:
    """Times every HTTP request and records those a route marked with a model, when the
    response has ended or the app has failed (then as 500, unless a status was sent).

    Parameters:
        app: the wrapped application.
        metrics: where the requests are recorded.
    """

    def __init__(self, app: ASGIApp, metrics: ActivatorMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            # The router fills this same scope dict, so a route's mark is visible here.
            model = scope.get(_MODEL_KEY)
            if model is not None:
                self.metrics.request_finished(
                    model=model, status=status, duration_s=time.perf_counter() - started
                )
