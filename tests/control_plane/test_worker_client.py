"""The worker client: the load request it sends, and what it reads from the worker."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest

from control_plane.errors import LoadFailedError, UpstreamError
from control_plane.records import ModelRecord, WorkerRecord
from control_plane.worker_client import WorkerClient, load_body

pytestmark = pytest.mark.anyio

WORKER = WorkerRecord(id="w1", url="http://worker")


def metrics_text(hits: float, misses: float, fetched: float, fetch_s: float) -> str:
    return f"""\
# HELP zeroserve_cache_hits_total Model fetches answered from the node cache
# TYPE zeroserve_cache_hits_total counter
zeroserve_cache_hits_total {hits}
# HELP zeroserve_cache_misses_total Model fetches that downloaded
# TYPE zeroserve_cache_misses_total counter
zeroserve_cache_misses_total {misses}
# HELP zeroserve_cache_fetched_bytes_total Bytes downloaded
# TYPE zeroserve_cache_fetched_bytes_total counter
zeroserve_cache_fetched_bytes_total {fetched}
# HELP zeroserve_cache_fetch_duration_seconds Fetch time
# TYPE zeroserve_cache_fetch_duration_seconds histogram
zeroserve_cache_fetch_duration_seconds_bucket{{le="+Inf"}} {misses}
zeroserve_cache_fetch_duration_seconds_count {misses}
zeroserve_cache_fetch_duration_seconds_sum {fetch_s}
"""


class Worker:
    """A fake worker: answers /metrics from a sequence and records load bodies."""

    def __init__(self, metrics: list[str], load_status: int = 200, error: str = "") -> None:
        self.metrics = list(metrics)
        self.load_status = load_status
        self.error = error
        self.bodies: list[dict[str, object]] = []

    def handler(self) -> Callable[[httpx.Request], httpx.Response]:
        def handle(request: httpx.Request) -> httpx.Response:
            if request.url.path == "/metrics":
                return httpx.Response(200, text=self.metrics.pop(0))
            self.bodies.append(json.loads(request.content))
            if self.load_status != 200:
                return httpx.Response(self.load_status, json={"error": self.error})
            return httpx.Response(200)

        return handle


def client_for(worker: Worker) -> WorkerClient:
    return WorkerClient(
        load_timeout_s=5, unload_timeout_s=5, transport=httpx.MockTransport(worker.handler())
    )


def test_load_body_carries_the_uri_and_a_named_config():
    model = ModelRecord(
        name="m", storage_uri="s3://b/m", backend="onnxruntime", config={"max_batch_size": 4}
    )
    body = load_body(model)
    assert body["parameters"]["storage_uri"] == "s3://b/m"
    assert json.loads(body["parameters"]["config"]) == {
        "max_batch_size": 4,
        "name": "m",
        "backend": "onnxruntime",
    }
    assert load_body(ModelRecord(name="m", storage_uri="/x")) == {
        "parameters": {"storage_uri": "/x"}
    }


@pytest.mark.parametrize(
    ("before", "after", "cache", "fetched", "fetch_s"),
    [
        pytest.param((1, 1, 100, 0.5), (1, 2, 1100, 1.25), "miss", 1000, 0.75, id="miss"),
        pytest.param((1, 1, 100, 0.5), (2, 1, 100, 0.5), "hit", 0, 0.0, id="hit"),
        pytest.param((1, 1, 100, 0.5), (1, 1, 100, 0.5), "unknown", 0, None, id="local"),
    ],
)
async def test_cache_outcome_from_counters(
    before: tuple[float, ...],
    after: tuple[float, ...],
    cache: str,
    fetched: int,
    fetch_s: float | None,
):
    worker = Worker([metrics_text(*before), metrics_text(*after)])
    client = client_for(worker)
    report = await client.load(WORKER, ModelRecord(name="m", storage_uri="/models/m"))
    await client.close()
    assert report.cache == cache
    assert report.bytes_fetched == fetched
    assert report.fetch_s == (pytest.approx(fetch_s) if fetch_s is not None else None)
    assert worker.bodies == [{"parameters": {"storage_uri": "/models/m"}}]


async def test_unreadable_metrics_leave_the_cache_unknown():
    worker = Worker(["not prometheus {{{", "also not"])
    client = client_for(worker)
    report = await client.load(WORKER, ModelRecord(name="m", storage_uri="/m"))
    await client.close()
    assert report.cache == "unknown"
    assert report.bytes_fetched is None


async def test_refused_load_carries_the_workers_message():
    worker = Worker([metrics_text(0, 0, 0, 0)], load_status=400, error="bad config: x")
    client = client_for(worker)
    with pytest.raises(LoadFailedError, match="400: bad config: x"):
        await client.load(WORKER, ModelRecord(name="m", storage_uri="/m"))
    await client.close()


async def test_unreachable_worker_is_an_upstream_error():
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    client = WorkerClient(
        load_timeout_s=5, unload_timeout_s=5, transport=httpx.MockTransport(refuse)
    )
    with pytest.raises(UpstreamError, match="load call failed") as info:
        await client.load(WORKER, ModelRecord(name="m", storage_uri="/m"))
    assert type(info.value) is UpstreamError
    with pytest.raises(UpstreamError, match="unload call failed"):
        await client.unload(WORKER, "m")
    assert not await client.is_live("http://worker")
    await client.close()
