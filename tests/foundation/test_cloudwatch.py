"""The CloudWatch publisher through its public seam: record, flush, and what reaches a sink.

PutMetricData itself is exercised against moto's CloudWatch over HTTP in
``tests/integration/test_cloudwatch_moto.py``.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any

import pytest

from foundation.cloudwatch import (
    ACTIVATION_DURATION,
    ACTIVATION_FAILURES,
    ACTIVATIONS,
    METRIC_NAMES,
    NAMESPACE,
    REQUEST_LATENCY,
    REQUESTS,
    REQUESTS_5XX,
    CloudWatchPublisher,
    PutMetricDataSink,
)

pytestmark = pytest.mark.anyio

MINUTE = 1_800_000_000  # a whole minute, in epoch seconds


class RecordingSink:
    """Keeps what it is sent; may fail on demand. Records the thread it ran on."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[dict[str, Any]]]] = []
        self.error: Exception | None = None
        self.threads: set[str] = set()

    def send(self, namespace: str, datums: Sequence[dict[str, Any]]) -> None:
        self.threads.add(threading.current_thread().name)
        if self.error is not None:
            raise self.error
        self.calls.append((namespace, list(datums)))

    def datums(self) -> list[dict[str, Any]]:
        return [datum for _, datums in self.calls for datum in datums]

    def by_name(self, name: str) -> list[dict[str, Any]]:
        return [datum for datum in self.datums() if datum["MetricName"] == name]


class Wall:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _publisher(sink: RecordingSink, wall: Wall | None = None, max_values: int = 1000):
    return CloudWatchPublisher(
        sink, flush_interval_s=60.0, max_values=max_values, wall=wall or Wall(MINUTE + 5)
    )


def _folded(datums: list[dict[str, Any]]) -> dict[float, float]:
    folded: dict[float, float] = {}
    for datum in datums:
        for value, count in zip(datum["Values"], datum["Counts"], strict=True):
            folded[value] = folded.get(value, 0) + count
    return folded


async def test_requests_fold_into_values_and_counts() -> None:
    sink = RecordingSink()
    publisher = _publisher(sink)
    for status, seconds in ((200, 0.012), (200, 0.012), (503, 0.5), (404, 0.0031234)):
        publisher.request_finished(model="mlp", status=status, duration_s=seconds)
    assert await publisher.flush() == 3
    assert [namespace for namespace, _ in sink.calls] == [NAMESPACE]
    assert sink.threads == {"cloudwatch_0"}  # boto3 blocks: never on the event loop
    [requests] = sink.by_name(REQUESTS)
    assert (requests["Unit"], requests["Values"], requests["Counts"]) == ("Count", [1.0], [4.0])
    [errors] = sink.by_name(REQUESTS_5XX)
    assert _folded([errors]) == {0.0: 3.0, 1.0: 1.0}  # Sum is the number of 5xx answers
    [latency] = sink.by_name(REQUEST_LATENCY)
    assert latency["Unit"] == "Milliseconds"
    assert _folded([latency]) == {3.123: 1.0, 12.0: 2.0, 500.0: 1.0}  # four digits kept
    assert requests["Timestamp"].timestamp() == MINUTE
    assert await publisher.flush() == 0  # nothing new
    await publisher.close()


async def test_activations_count_failures_and_time_only_successes() -> None:
    sink = RecordingSink()
    publisher = _publisher(sink)
    publisher.activation_finished(model="mlp", outcome="ready", duration_s=2.5)
    publisher.activation_finished(model="mlp", outcome="revived", duration_s=0.25)
    publisher.activation_finished(model="mlp", outcome="failed", duration_s=900.0)
    await publisher.close()
    assert _folded(sink.by_name(ACTIVATIONS)) == {1.0: 3.0}
    assert _folded(sink.by_name(ACTIVATION_FAILURES)) == {0.0: 2.0, 1.0: 1.0}
    [duration] = sink.by_name(ACTIVATION_DURATION)
    assert duration["Unit"] == "Seconds"
    assert _folded([duration]) == {0.25: 1.0, 2.5: 1.0}
    assert {d["MetricName"] for d in sink.datums()} <= METRIC_NAMES


async def test_each_minute_is_its_own_datum() -> None:
    sink, wall = RecordingSink(), Wall(MINUTE + 59)
    publisher = _publisher(sink, wall)
    publisher.request_finished(model="mlp", status=200, duration_s=0.01)
    wall.now = MINUTE + 61
    publisher.request_finished(model="mlp", status=200, duration_s=0.01)
    await publisher.close()
    stamps = [d["Timestamp"].timestamp() for d in sink.by_name(REQUESTS)]
    assert stamps == [MINUTE, MINUTE + 60]


async def test_the_table_is_bounded_and_repeats_cost_nothing() -> None:
    sink = RecordingSink()
    publisher = _publisher(sink, max_values=4)
    for _ in range(100):  # Requests 1.0, Requests5xx 0.0, one latency: three values
        publisher.request_finished(model="mlp", status=200, duration_s=0.01)
    publisher.request_finished(model="mlp", status=200, duration_s=0.02)  # the fourth value
    publisher.request_finished(model="mlp", status=200, duration_s=0.03)  # no room
    publisher.request_finished(model="mlp", status=200, duration_s=math.nan)  # never sent
    assert publisher.dropped == 1
    await publisher.flush()
    assert _folded(sink.by_name(REQUEST_LATENCY)) == {10.0: 100.0, 20.0: 1.0}
    assert _folded(sink.by_name(REQUESTS)) == {1.0: 103.0}
    # A flush empties the table: there is room again.
    publisher.request_finished(model="mlp", status=200, duration_s=0.04)
    await publisher.close()
    assert _folded(sink.by_name(REQUEST_LATENCY))[40.0] == 1.0


async def test_many_distinct_values_split_into_datums_of_150() -> None:
    sink = RecordingSink()
    publisher = _publisher(sink, max_values=1000)
    for i in range(1, 401):
        publisher.activation_finished(model="mlp", outcome="ready", duration_s=float(i))
    await publisher.close()
    durations = sink.by_name(ACTIVATION_DURATION)
    assert [len(d["Values"]) for d in durations] == [150, 150, 100]
    assert sum(sum(d["Counts"]) for d in durations) == 400


async def test_a_failed_send_drops_its_values_and_the_next_one_goes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink = RecordingSink()
    publisher = _publisher(sink)
    sink.error = ConnectionError("CloudWatch is down")
    publisher.request_finished(model="mlp", status=200, duration_s=0.01)
    assert await publisher.flush() == 0
    assert publisher.dropped == 3
    assert "could not publish" in caplog.text
    sink.error = None
    publisher.request_finished(model="mlp", status=200, duration_s=0.01)
    assert await publisher.flush() == 3
    assert publisher.sent == 3
    await publisher.close()


async def test_after_close_nothing_is_taken() -> None:
    sink = RecordingSink()
    publisher = _publisher(sink)
    publisher.request_finished(model="mlp", status=200, duration_s=0.01)
    await publisher.close()
    publisher.request_finished(model="mlp", status=200, duration_s=0.01)
    assert publisher.dropped == 3
    assert _folded(sink.by_name(REQUESTS)) == {1.0: 1.0}


class RecordingClient:
    """The one CloudWatch client method the sink calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[dict[str, Any]]]] = []

    def put_metric_data(self, *, Namespace: str, MetricData: list[dict[str, Any]]) -> None:
        self.calls.append((Namespace, MetricData))


async def test_put_metric_data_calls_stay_within_cloudwatchs_limits() -> None:
    client = RecordingClient()
    wall = Wall(MINUTE)
    publisher = CloudWatchPublisher(
        PutMetricDataSink(client=client), flush_interval_s=60.0, max_values=30_000, wall=wall
    )
    for minute in range(1100):  # one value per minute: 1,100 one-value datums
        wall.now = MINUTE + 60 * minute
        publisher.activation_finished(model="mlp", outcome="failed", duration_s=1.0)
    await publisher.flush()
    assert [len(datums) for _, datums in client.calls[:2]] == [1000, 1000]
    client.calls.clear()
    wall.now = MINUTE
    for i in range(1, 10_000):  # 9,999 distinct values in one minute: 67 datums
        publisher.activation_finished(model="mlp", outcome="ready", duration_s=float(i))
    await publisher.close()
    values_per_call = [sum(len(d["Values"]) for d in datums) for _, datums in client.calls]
    # The durations, one Activations value and one ActivationFailures value, in two calls.
    assert values_per_call == [10_000, 1]
    assert {namespace for namespace, _ in client.calls} == {NAMESPACE}
