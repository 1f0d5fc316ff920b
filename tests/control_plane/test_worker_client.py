"""The worker client: the load request it sends, and what it reads from the worker."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest

from control_plane.errors import LoadFailedError, WorkerCallError
from control_plane.worker_client import WorkerClient, load_body
from foundation.records import ModelRecord, WorkerRecord

pytestmark = pytest.mark.anyio

WORKER = WorkerRecord(id="w1", url="http://worker")


class Worker:
    """A fake worker: answers loads with ``answer`` (None: an empty body, as Triton does)
    and records their bodies; any other path is an error."""

    def __init__(
        self,
        answer: dict[str, object] | None = None,
        load_status: int = 200,
        error: str = "",
    ) -> None:
        self.answer = answer
        self.load_status = load_status
        self.error = error
        self.bodies: list[dict[str, object]] = []
        self.paths: list[str] = []

    def handler(self) -> Callable[[httpx.Request], httpx.Response]:
        def handle(request: httpx.Request) -> httpx.Response:
            self.paths.append(request.url.path)
            self.bodies.append(json.loads(request.content))
            if self.load_status != 200:
                return httpx.Response(self.load_status, json={"error": self.error})
            if self.answer is None:
                return httpx.Response(200)
            return httpx.Response(200, json=self.answer)

        return handle


def client_for(worker: Worker) -> WorkerClient:
    return WorkerClient(
        load_timeout_s=5, unload_timeout_s=5, transport=httpx.MockTransport(worker.handler())
    )


def answering(path: str, status: int, answer: dict[str, object] | None) -> WorkerClient:
    """A client of a worker that answers ``path`` (only) with ``status`` and ``answer`` as
    JSON, or an HTML page when ``answer`` is None."""

    def handle(request: httpx.Request) -> httpx.Response:
        assert request.url.path == path
        if answer is None:
            return httpx.Response(status, content=b"<html>")
        return httpx.Response(status, json=answer)

    return WorkerClient(load_timeout_s=5, unload_timeout_s=5, transport=httpx.MockTransport(handle))


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
    ("answer", "cache", "fetched", "fetch_s"),
    [
        pytest.param(
            {"cache": "miss", "bytes_fetched": 1000, "fetch_s": 0.75}, "miss", 1000, 0.75, id="miss"
        ),
        pytest.param(
            {"cache": "hit", "bytes_fetched": 0, "fetch_s": 0.01}, "hit", 0, 0.01, id="hit"
        ),
        pytest.param(
            {"cache": "local", "bytes_fetched": 0, "fetch_s": 0}, "local", 0, 0.0, id="local"
        ),
    ],
)
async def test_cache_outcome_from_the_load_answer(
    answer: dict[str, object], cache: str, fetched: int, fetch_s: float
):
    worker = Worker(answer)
    client = client_for(worker)
    report = await client.load(WORKER, ModelRecord(name="m", storage_uri="/models/m"))
    await client.close()
    assert report.cache == cache
    assert report.bytes_fetched == fetched
    assert report.fetch_s == pytest.approx(fetch_s)
    # One call: nothing is read from the worker's counters around the load any more.
    assert worker.paths == ["/v2/repository/models/m/load"]
    assert worker.bodies == [{"parameters": {"storage_uri": "/models/m"}}]


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(None, id="empty-body"),
        pytest.param({"cache": "maybe", "bytes_fetched": 0, "fetch_s": 0}, id="unknown-cache"),
        pytest.param({"cache": "miss", "bytes_fetched": -1, "fetch_s": 0}, id="negative-bytes"),
        pytest.param({"cache": "miss", "bytes_fetched": "9", "fetch_s": 0}, id="bytes-string"),
        pytest.param({"cache": "hit", "bytes_fetched": 0}, id="no-fetch-time"),
    ],
)
async def test_a_load_answer_without_a_usable_report_leaves_the_cache_unknown(
    answer: dict[str, object] | None,
):
    client = client_for(Worker(answer))
    report = await client.load(WORKER, ModelRecord(name="m", storage_uri="/m"))
    await client.close()
    assert report.cache == "unknown"
    assert report.bytes_fetched is None
    assert report.fetch_s is None


async def test_refused_load_carries_the_workers_message():
    worker = Worker(load_status=400, error="bad config: x")
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
    with pytest.raises(WorkerCallError, match="load call failed") as info:
        await client.load(WORKER, ModelRecord(name="m", storage_uri="/m"))
    assert type(info.value) is WorkerCallError
    with pytest.raises(WorkerCallError, match="unload call failed"):
        await client.unload(WORKER, "m")
    assert not await client.is_live("http://worker")
    await client.close()


async def test_a_name_is_one_path_segment_in_every_worker_url():
    """Registration refuses such names now; one stored before must still not become
    another path or a query on the worker."""
    worker = Worker({"cache": "local", "bytes_fetched": 0, "fetch_s": 0.0})
    raw: list[bytes] = []
    handle = worker.handler()

    def record(request: httpx.Request) -> httpx.Response:
        raw.append(request.url.raw_path)
        return handle(request)

    client = WorkerClient(
        load_timeout_s=5, unload_timeout_s=5, transport=httpx.MockTransport(record)
    )
    name = "a/b?c#d e"
    await client.load(WORKER, ModelRecord(name=name, storage_uri="/m"))
    await client.unload(WORKER, name)
    await client.close()
    assert raw == [
        b"/v2/repository/models/a%2Fb%3Fc%23d%20e/load",
        b"/v2/repository/models/a%2Fb%3Fc%23d%20e/unload",
    ]


@pytest.mark.parametrize(
    ("status", "answer", "expected"),
    [
        pytest.param(
            200,
            {"name": "m", "fetching": True, "bytes_fetched": 5, "bytes_total": 9},
            (5, 9),
            id="fetching",
        ),
        pytest.param(
            200,
            {"name": "m", "fetching": False, "bytes_fetched": None, "bytes_total": None},
            None,
            id="not-fetching",
        ),
        pytest.param(404, {"error": "Not Found"}, None, id="older-worker"),
        pytest.param(200, {"fetching": True, "bytes_fetched": "5"}, None, id="malformed"),
        pytest.param(200, None, None, id="not-json"),
    ],
)
async def test_fetch_progress_is_read_when_the_worker_says_and_none_otherwise(
    status: int, answer: dict[str, object] | None, expected: tuple[int, int] | None
):
    client = answering("/v2/repository/models/m/progress", status, answer)
    try:
        assert await client.fetch_progress(WORKER, "m") == expected
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("status", "answer", "expected"),
    [
        pytest.param(200, {"name": "m", "versions": ["1", "3"]}, ["1", "3"], id="served"),
        pytest.param(404, {"error": "unknown model"}, None, id="not-loaded-there"),
        pytest.param(200, {"name": "m", "versions": [1]}, None, id="not-strings"),
        pytest.param(200, {"name": "m"}, None, id="no-versions"),
        pytest.param(200, None, None, id="not-json"),
    ],
)
async def test_served_versions_are_the_workers_list_and_none_otherwise(
    status: int, answer: dict[str, object] | None, expected: list[str] | None
):
    client = answering("/v2/models/m", status, answer)
    try:
        assert await client.served_versions(WORKER.url, "m") == expected
    finally:
        await client.close()
