"""Per-model traffic as this activator sees it, reported to the control plane.

Requests count from arrival to the end of their response, buffered time included: a
request waiting for a cold model is demand the autoscaler must see. Each report round
sends one :class:`TrafficReport` per model that had requests in flight or any arrival or
completion since the previous round; a model that went quiet is reported once with zero
in flight and then no more, so idle models cost the store nothing. The same rounds send
the first response of each cold start (:class:`FirstResponse`), which closes its timeline.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from foundation.records import FirstResponse, TrafficReport

logger = logging.getLogger(__name__)


class TrafficSink(Protocol):
    """Where reports go (``StateStore`` is one)."""

    async def report_traffic(self, report: TrafficReport) -> None: ...

    async def report_first_response(self, report: FirstResponse) -> None: ...


class _Counter:
    __slots__ = ("in_flight", "is_dirty", "last_request_at")

    def __init__(self) -> None:
        self.in_flight = 0
        self.last_request_at = 0.0
        self.is_dirty = False


class Traffic:
    """Counts requests per model and reports them every ``interval_s``.

    Parameters:
        sink: receives the reports.
        activator_id: names this activator in the reports.
        interval_s: time between report rounds.
        clock: wall-clock seconds since the epoch (the records' time base).
    """

    def __init__(
        self,
        sink: TrafficSink,
        activator_id: str,
        *,
        interval_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._sink = sink
        self._activator_id = activator_id
        self._interval_s = interval_s
        self._clock = clock
        self._counters: dict[str, _Counter] = {}
        self._first_responses: dict[str, FirstResponse] = {}
        """model -> its cold start's first response, until sent (one per model: bounded)."""

    def begin(self, model: str) -> None:
        """A request for ``model`` arrived."""
        counter = self._counters.get(model)
        if counter is None:
            counter = self._counters[model] = _Counter()
        counter.in_flight += 1
        counter.last_request_at = self._clock()
        counter.is_dirty = True

    def end(self, model: str) -> None:
        """A request for ``model`` was answered (or abandoned)."""
        counter = self._counters[model]
        counter.in_flight -= 1
        counter.is_dirty = True

    def first_response(self, model: str, worker_id: str, waited_s: float) -> None:
        """A request of a burst that waited for ``model`` to be activated got the burst's
        first response, from ``worker_id``, ``waited_s`` after the activation was asked for.
        Sent in the next round; while one is unsent, later ones for the model are dropped."""
        if model not in self._first_responses:
            self._first_responses[model] = FirstResponse(
                model=model,
                activator_id=self._activator_id,
                worker_id=worker_id,
                responded_at=self._clock(),
                waited_s=waited_s,
            )

    def in_flight(self, model: str) -> int:
        counter = self._counters.get(model)
        return counter.in_flight if counter is not None else 0

    async def run(self) -> None:
        """Report every ``interval_s`` until cancelled."""
        while True:
            await asyncio.sleep(self._interval_s)
            await self.flush()

    async def flush(self) -> None:
        """One report round. A failed report is logged and retried next round."""
        now = self._clock()
        # Every counter present is busy or changed since the last round: one that is
        # reported idle and unchanged is dropped below, and begin() makes a new one.
        for model, counter in list(self._counters.items()):
            counter.is_dirty = False
            report = TrafficReport(
                model=model,
                activator_id=self._activator_id,
                in_flight=counter.in_flight,
                last_request_at=counter.last_request_at,
                reported_at=now,
            )
            try:
                await self._sink.report_traffic(report)
            except Exception:
                logger.warning("traffic report for %s failed", model, exc_info=True)
                counter.is_dirty = True
                continue
            if counter.in_flight == 0 and not counter.is_dirty:
                del self._counters[model]
        for model, first in list(self._first_responses.items()):
            try:
                await self._sink.report_first_response(first)
            except Exception:
                logger.warning("first-response report for %s failed", model, exc_info=True)
                continue
            del self._first_responses[model]
