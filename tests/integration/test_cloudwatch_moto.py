"""The CloudWatch publisher against moto's CloudWatch, over HTTP on loopback: what
PutMetricData stores is what CloudWatch's statistics then read back."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from foundation.cloudwatch import (
    ACTIVATION_DURATION,
    ACTIVATION_FAILURES,
    METRIC_NAMES,
    NAMESPACE,
    REQUEST_LATENCY,
    REQUESTS,
    REQUESTS_5XX,
    CloudWatchPublisher,
    PutMetricDataSink,
)
from tests.data_plane.storage.s3_server import CREDENTIALS, REGION, MotoServer, start_moto

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


@pytest.fixture
def moto(tmp_path: Path) -> Iterator[MotoServer]:
    server = start_moto(tmp_path)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def aws_env(moto: MotoServer, monkeypatch: pytest.MonkeyPatch) -> Any:
    """boto3's standard environment, pointed at moto: what the publisher reads in a pod."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_CLOUDWATCH", moto.url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", CREDENTIALS["aws_access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", CREDENTIALS["aws_secret_access_key"])
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    # botocore gzips PutMetricData bodies past 10 kB and moto_server (5.2) fails to read
    # them; CloudWatch itself takes either.
    monkeypatch.setenv("AWS_DISABLE_REQUEST_COMPRESSION", "true")
    return boto3.client("cloudwatch", endpoint_url=moto.url, region_name=REGION, **CREDENTIALS)


def statistics(
    cloudwatch: Any, name: str, *stats: str, unit: str | None = None
) -> dict[str, float]:
    """``stats`` of metric ``name`` over the last hour, summed over its datapoints."""
    now = datetime.datetime.now(datetime.UTC)
    response = cloudwatch.get_metric_statistics(
        Namespace=NAMESPACE,
        MetricName=name,
        StartTime=now - datetime.timedelta(hours=1),
        EndTime=now + datetime.timedelta(minutes=5),
        Period=3600,
        Statistics=list(stats),
        **({"Unit": unit} if unit else {}),
    )
    totals: dict[str, float] = dict.fromkeys(stats, 0.0)
    for point in response["Datapoints"]:
        for stat in stats:
            totals[stat] += point[stat]
    return totals


async def test_put_metric_data_reaches_cloudwatch(aws_env: Any) -> None:
    publisher = CloudWatchPublisher(PutMetricDataSink(), flush_interval_s=60.0, max_values=1000)
    for i in range(400):  # 400 distinct latencies: three datums
        publisher.request_finished(model="mlp", status=503 if i < 30 else 200, duration_s=i / 1e4)
    publisher.activation_finished(model="mlp", outcome="ready", duration_s=1.25)
    publisher.activation_finished(model="mlp", outcome="failed", duration_s=900.0)
    await publisher.close()
    assert publisher.dropped == 0

    cloudwatch = aws_env
    pages = cloudwatch.get_paginator("list_metrics").paginate(Namespace=NAMESPACE)
    assert {m["MetricName"] for page in pages for m in page["Metrics"]} == METRIC_NAMES
    assert statistics(cloudwatch, REQUESTS, "Sum") == {"Sum": 400}
    assert statistics(cloudwatch, REQUESTS_5XX, "Sum", "SampleCount") == {
        "Sum": 30,
        "SampleCount": 400,
    }
    latency = statistics(cloudwatch, REQUEST_LATENCY, "SampleCount", "Maximum", unit="Milliseconds")
    assert latency == {"SampleCount": 400, "Maximum": 39.9}
    assert statistics(cloudwatch, ACTIVATION_FAILURES, "Sum", "SampleCount") == {
        "Sum": 1,
        "SampleCount": 2,
    }
    assert statistics(cloudwatch, ACTIVATION_DURATION, "Maximum", unit="Seconds") == {
        "Maximum": 1.25
    }


async def test_an_unreachable_cloudwatch_drops_values_and_raises_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.integration.conftest import free_port

    # Nothing listens there: every attempt is refused at once.
    monkeypatch.setenv("AWS_ENDPOINT_URL_CLOUDWATCH", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    sink = PutMetricDataSink(connect_timeout_s=1.0, read_timeout_s=1.0, max_attempts=1)
    publisher = CloudWatchPublisher(sink, flush_interval_s=60.0, max_values=100)
    publisher.request_finished(model="mlp", status=200, duration_s=0.01)
    assert await publisher.flush() == 0
    assert publisher.dropped == 3
    await publisher.close()
