"""CloudWatch metrics for cluster mode: activations and model requests, sent with
PutMetricData under the ``zeroserve`` namespace.

Off by default; ``cloudwatch_enabled`` in the control plane's and the activator's settings
turns it on. Recording is a non-blocking count in a bounded table of distinct values per minute and
metric (values rounded to four significant digits, so a busy activator repeats itself and
memory does not grow with traffic); when the table is full a new value is dropped and
counted, because metrics must never slow or stop the request path. A background task
flushes every ``flush_interval_s``: the table becomes datums with ``Values``/``Counts`` (so
CloudWatch still computes percentiles), sent on a thread of its own since boto3 blocks. At
most one send is in flight; while CloudWatch is slow or down, values accumulate up to the
bound and the rest are dropped.

The namespace and the metric names below are a contract with the alarms in
``infra/terraform`` (a test keeps the two equal): rename one, rename both.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, Protocol

__all__ = [
    "ACTIVATIONS",
    "ACTIVATION_DURATION",
    "ACTIVATION_FAILURES",
    "METRIC_NAMES",
    "NAMESPACE",
    "REQUESTS",
    "REQUESTS_5XX",
    "REQUEST_LATENCY",
    "CloudWatchPublisher",
    "MetricSink",
    "PutMetricDataSink",
]

logger = logging.getLogger(__name__)

NAMESPACE = "zeroserve"
"""The CloudWatch namespace every zeroserve metric goes to."""

ACTIVATIONS = "Activations"
"""Count: finished activations, whatever their outcome (control plane)."""
ACTIVATION_FAILURES = "ActivationFailures"
"""Count: 1 per failed activation, 0 per successful one, so Sum is failures (control plane)."""
ACTIVATION_DURATION = "ActivationDuration"
"""Seconds: from queued to ready, successful activations only (control plane)."""
REQUESTS = "Requests"
"""Count: model requests the activator answered (proxied, buffered or refused)."""
REQUESTS_5XX = "Requests5xx"
"""Count: 1 per model request answered 5xx, 0 otherwise, so Sum is 5xx answers (activator)."""
REQUEST_LATENCY = "RequestLatency"
"""Milliseconds: from a model request's arrival to the end of its response (activator)."""

METRIC_NAMES = frozenset(
    {
        ACTIVATIONS,
        ACTIVATION_FAILURES,
        ACTIVATION_DURATION,
        REQUESTS,
        REQUESTS_5XX,
        REQUEST_LATENCY,
    }
)
"""Every metric name zeroserve publishes."""

_MAX_VALUES_PER_DATUM = 150
"""PutMetricData's bound on one datum's ``Values`` array."""
_MAX_DATUMS_PER_CALL = 1000
"""PutMetricData's bound on datums in one call."""
_MAX_VALUES_PER_CALL = 10_000
"""Keeps one call well under the 1 MB request limit (a value costs a few dozen bytes)."""
_SIGNIFICANT_DIGITS = 4
"""Values are rounded to this many significant digits (more than an alarm threshold needs)
so that repeated values fold into one ``Values`` entry with a count."""


_Key = tuple[int, str, str]
"""(wall-clock minute in epoch seconds, metric name, unit): one datum's identity. A minute
is CloudWatch's standard resolution."""


class MetricSink(Protocol):
    """Sends datums to CloudWatch; blocking, called on the publisher's own thread."""

    def send(self, namespace: str, datums: Sequence[dict[str, Any]]) -> None: ...


class PutMetricDataSink:
    """PutMetricData through boto3, with the standard AWS environment (region, credentials,
    ``AWS_ENDPOINT_URL_CLOUDWATCH``). The client is made on first use, on the sending
    thread, because building one reads files and must not run on the event loop.

    Parameters:
        connect_timeout_s, read_timeout_s: botocore's, per attempt.
        max_attempts: botocore's retry budget; with the timeouts it bounds one send.
        client: a CloudWatch client to use instead of building one.
    """

    def __init__(
        self,
        *,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 10.0,
        max_attempts: int = 3,
        client: Any = None,
    ) -> None:
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._max_attempts = max_attempts
        self._client = client

    def send(self, namespace: str, datums: Sequence[dict[str, Any]]) -> None:
        if self._client is None:
            import boto3
            from botocore.config import Config

            config = Config(
                connect_timeout=self._connect_timeout_s,
                read_timeout=self._read_timeout_s,
                retries={"max_attempts": self._max_attempts, "mode": "standard"},
            )
            self._client = boto3.session.Session().client("cloudwatch", config=config)
        for batch in _batches(datums):
            self._client.put_metric_data(Namespace=namespace, MetricData=batch)


class CloudWatchPublisher:
    """Buffers activation and request metrics and publishes them in batches.

    Parameters:
        sink: where datums go (``PutMetricDataSink`` in a cluster).
        flush_interval_s: how often buffered points are sent.
        max_values: distinct values held between two flushes; beyond it new ones are dropped.
        close_timeout_s: bound on the last flush at :meth:`close`.
        wall: the wall clock (CloudWatch timestamps are wall-clock).
    """

    def __init__(
        self,
        sink: MetricSink,
        *,
        flush_interval_s: float,
        max_values: int,
        close_timeout_s: float = 10.0,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._sink = sink
        self._flush_interval_s = flush_interval_s
        self._max_values = max_values
        self._close_timeout_s = close_timeout_s
        self._wall = wall
        self._table: dict[_Key, Counter[float]] = {}
        self._size = 0
        """Distinct values in the table."""
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cloudwatch")
        self._is_closed = False
        self.dropped = 0
        """Values lost to a full table or a failed send, since start."""
        self.sent = 0
        """Datums sent, since start."""

    # ---- recording (synchronous, never blocks) ----

    def activation_finished(self, *, model: str, outcome: str, duration_s: float) -> None:
        """Record one finished activation (``outcome`` is ready, revived or failed)."""
        is_failed = outcome == "failed"
        self._add(ACTIVATIONS, "Count", 1.0)
        self._add(ACTIVATION_FAILURES, "Count", 1.0 if is_failed else 0.0)
        if not is_failed:
            self._add(ACTIVATION_DURATION, "Seconds", duration_s)

    def request_finished(self, *, model: str, status: int, duration_s: float) -> None:
        """Record one answered model request."""
        minute = self._minute()
        self._add(REQUESTS, "Count", 1.0, minute)
        self._add(REQUESTS_5XX, "Count", 1.0 if status >= 500 else 0.0, minute)
        self._add(REQUEST_LATENCY, "Milliseconds", duration_s * 1000.0, minute)

    def _minute(self) -> int:
        return int(self._wall()) // 60 * 60

    def _add(self, name: str, unit: str, value: float, minute: int | None = None) -> None:
        if not math.isfinite(value):
            return  # CloudWatch refuses NaN and infinities
        if self._is_closed:
            self.dropped += 1
            return
        key = (self._minute() if minute is None else minute, name, unit)
        counts = self._table.get(key)
        if counts is None:
            counts = self._table[key] = Counter()
        rounded = _round(value)
        if rounded not in counts:
            if self._size >= self._max_values:
                self.dropped += 1
                return
            self._size += 1
        counts[rounded] += 1

    # ---- publishing ----

    async def run(self) -> None:
        """Flush every ``flush_interval_s`` until cancelled."""
        while True:
            await asyncio.sleep(self._flush_interval_s)
            await self.flush()

    async def flush(self) -> int:
        """Send what is buffered now; the number of datums sent. A failed send is logged and
        its values are dropped: retrying them would let an outage grow the table."""
        table, self._table, size, self._size = self._table, {}, self._size, 0
        if not table:
            return 0
        datums = _build_datums(table)
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._sink.send, NAMESPACE, datums)
        except Exception as exc:
            self.dropped += size
            logger.warning(
                "could not publish %d CloudWatch datums (%d values dropped so far): %s",
                len(datums),
                self.dropped,
                exc,
            )
            return 0
        self.sent += len(datums)
        return len(datums)

    async def close(self) -> None:
        """Stop taking points, send what is left (bounded by ``close_timeout_s``), and let
        the sending thread go."""
        self._is_closed = True
        try:
            async with asyncio.timeout(self._close_timeout_s):
                await self.flush()
        except TimeoutError:
            logger.warning("the last CloudWatch flush did not finish in time; abandoned")
        finally:
            self._executor.shutdown(wait=False, cancel_futures=True)


def _build_datums(table: dict[_Key, Counter[float]]) -> list[dict[str, Any]]:
    """PutMetricData datums: one per minute, metric and unit, split past 150 values."""
    datums: list[dict[str, Any]] = []
    for (minute, name, unit), counts in sorted(table.items()):
        items = sorted(counts.items())
        for start in range(0, len(items), _MAX_VALUES_PER_DATUM):
            chunk = items[start : start + _MAX_VALUES_PER_DATUM]
            datums.append(
                {
                    "MetricName": name,
                    "Timestamp": datetime.fromtimestamp(minute, UTC),
                    "Unit": unit,
                    "Values": [value for value, _ in chunk],
                    "Counts": [float(count) for _, count in chunk],
                }
            )
    return datums


def _round(value: float) -> float:
    if value == 0.0 or value == 1.0:
        return value  # the counts: most values, and already exact
    digits = _SIGNIFICANT_DIGITS - 1 - math.floor(math.log10(abs(value)))
    return round(value, digits)


def _batches(datums: Sequence[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    batch: list[dict[str, Any]] = []
    values = 0
    for datum in datums:
        size = len(datum["Values"])
        if batch and (len(batch) == _MAX_DATUMS_PER_CALL or values + size > _MAX_VALUES_PER_CALL):
            yield batch
            batch, values = [], 0
        batch.append(datum)
        values += size
    if batch:
        yield batch
