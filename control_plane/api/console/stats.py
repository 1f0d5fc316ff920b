"""Requests per model over the last hour and day, from the platform's own counters.

The activator counts every answered request (``zeroserve_activator_requests_total``) and
times it (``zeroserve_activator_request_duration_seconds``, a histogram) in the registry the
admin port serves. Those are totals since the process started; ``RequestHistory`` keeps a
sample of them every ``period_s`` for ``span_s``, so that a window is the difference between
now and the sample at its start. A window longer than the history kept so far covers only
that history, and says how long it covers. Without an activator in the process (a
standalone control plane) there are no such counters and no windows.
"""

from __future__ import annotations

import asyncio
import bisect
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

__all__ = ["Counts", "RequestHistory", "Window", "quantile", "read_counts"]

_REQUESTS = "zeroserve_activator_requests"
_DURATION = "zeroserve_activator_request_duration_seconds"


@dataclass(frozen=True, slots=True)
class Counts:
    """One model's cumulative counters at one moment."""

    requests: float
    errors: float
    """Answers with a 5xx status."""
    buckets: tuple[tuple[float, float], ...]
    """(upper bound in seconds, cumulative count), ascending, ending with +Inf."""


@dataclass(frozen=True, slots=True)
class Window:
    """What one model served in one window."""

    requests: int
    errors: int
    covered_s: float
    """How much of the window the history covers (less than asked while it is young)."""
    p50_s: float | None
    p99_s: float | None

    @property
    def rate_per_s(self) -> float:
        return self.requests / self.covered_s if self.covered_s > 0 else 0.0


def read_counts(registry: CollectorRegistry) -> dict[str, Counts]:
    """model -> its counters now; empty when the registry has no activator."""
    requests: dict[str, float] = {}
    errors: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    for family in registry.collect():
        if family.name == _REQUESTS:
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    model = sample.labels["model"]
                    requests[model] = requests.get(model, 0.0) + sample.value
                    if sample.labels.get("code", "").startswith("5"):
                        errors[model] = errors.get(model, 0.0) + sample.value
        elif family.name == _DURATION:
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    bounds = buckets.setdefault(sample.labels["model"], {})
                    bounds[float(sample.labels["le"])] = sample.value
    return {
        model: Counts(
            requests=count,
            errors=errors.get(model, 0.0),
            buckets=tuple(sorted(buckets.get(model, {}).items())),
        )
        for model, count in requests.items()
    }


def quantile(q: float, buckets: tuple[tuple[float, float], ...]) -> float | None:
    """The ``q`` quantile of a cumulative histogram, interpolated within its bucket as
    Prometheus' ``histogram_quantile`` does; the largest finite bound when it falls in the
    +Inf bucket; None without observations."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    index = bisect.bisect_left([count for _, count in buckets], rank)
    upper, count = buckets[index]
    lower, below = buckets[index - 1] if index > 0 else (0.0, 0.0)
    if math.isinf(upper):
        return lower
    if count == below:
        return upper
    return lower + (upper - lower) * (rank - below) / (count - below)


class RequestHistory:
    """Samples of every model's counters, one per ``period_s``, kept for ``span_s``.

    ``run`` samples until cancelled; ``window`` compares the counters now with the sample
    at the window's start. Bounded: ``span_s / period_s`` samples.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        period_s: float = 60.0,
        span_s: float = 86400.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._registry = registry
        self._period_s = period_s
        self._clock = clock
        self._samples: deque[tuple[float, dict[str, Counts]]] = deque(
            maxlen=max(1, int(span_s / period_s)) + 1
        )
        self.sample()

    def sample(self) -> None:
        self._samples.append((self._clock(), read_counts(self._registry)))

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._period_s)
            self.sample()

    def windows(self, span_s: float) -> dict[str, Window]:
        """model -> what it served in the last ``span_s`` (as far as the history goes)."""
        now = self._clock()
        current = read_counts(self._registry)
        start_at, start = self._samples[0]
        for at, counts in self._samples:
            if at > now - span_s:
                break
            start_at, start = at, counts
        return {
            model: _window(counts, start.get(model), now - start_at)
            for model, counts in current.items()
        }


def _window(now: Counts, then: Counts | None, covered_s: float) -> Window:
    before: Mapping[float, float] = dict(then.buckets) if then is not None else {}
    buckets = tuple((le, count - before.get(le, 0.0)) for le, count in now.buckets)
    return Window(
        requests=int(now.requests - (then.requests if then else 0.0)),
        errors=int(now.errors - (then.errors if then else 0.0)),
        covered_s=covered_s,
        p50_s=quantile(0.5, buckets),
        p99_s=quantile(0.99, buckets),
    )
