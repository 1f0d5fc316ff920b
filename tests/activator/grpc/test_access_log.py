"""The access log of the activator's gRPC endpoint, and the request id it passes on to the
worker, over fake workers in process, on both front ends (grpc.aio's interceptor and the
h2corn front end's wrapper write the same lines)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import grpc
import orjson
import pytest

from activator.access_log import ACCESS_LOGGER
from foundation.keys import ApiKeyRecord, NewKey, new_key
from foundation.proto import grpc_service_pb2 as pb
from tests.activator.fakes import FakeStore, RecordingActivate
from tests.activator.grpc.conftest import (
    WAIT_S,
    PlaceOnActivate,
    grpc_activator,
    infer_request,
    place,
    wait_until,
)
from tests.activator.grpc.fake_worker import FakeWorker

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["aio", "h2corn"])
def frontend(request: pytest.FixtureRequest) -> str:
    """The front end carrying the activator's gRPC endpoint."""
    name: str = request.param
    return name


@pytest.fixture
def entries() -> Iterator[list[dict[str, object]]]:
    """The access log's entries meanwhile (JSON lines, decoded)."""
    written: list[dict[str, object]] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            written.append(orjson.loads(record.getMessage()))

    handler = Collect()
    logger = logging.getLogger(ACCESS_LOGGER)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield written
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


async def test_a_call_is_one_line_and_its_id_reaches_the_worker(
    entries: list[dict[str, object]], frontend: str
):
    store = FakeStore()
    store.register("m")
    async with FakeWorker("w1") as worker:
        await place(store, "m", worker)
        async with grpc_activator(
            store, RecordingActivate(), access_log_format="json", grpc_frontend=frontend
        ) as client:
            named = await client.infer(
                "m", metadata=(("x-request-id", "caller-7"),), timeout=WAIT_S
            )
            unnamed = await client.infer("m", timeout=WAIT_S)
            await client.unary("ServerLive", pb.ServerLiveResponse)(pb.ServerLiveRequest())
            await client.unary("ServerReady", pb.ServerReadyResponse)(pb.ServerReadyRequest())
    assert named.model_name == unnamed.model_name == "m"
    first, second = entries  # the health RPCs are not logged
    assert worker.metadata[0]["x-request-id"] == first["request_id"] == "caller-7"
    assert worker.metadata[1]["x-request-id"] == second["request_id"]
    assert len(str(second["request_id"])) == 32
    assert first["protocol"] == "grpc"
    assert first["target"] == "/inference.GRPCInferenceService/ModelInfer"
    assert (first["model"], first["status"], first["waited"]) == ("m", "OK", False)
    assert first["bytes_in"] == len(infer_request("m").SerializeToString())
    assert first["bytes_out"] == named.ByteSize()


async def test_refusals_and_cold_starts_are_logged_with_their_status_and_wait(
    entries: list[dict[str, object]], frontend: str
):
    store = FakeStore()
    store.register("cold")
    async with FakeWorker("w1") as worker:
        activate = PlaceOnActivate(store, [worker])
        async with grpc_activator(
            store, activate, access_log_format="json", grpc_frontend=frontend
        ) as client:
            answer = await client.infer("cold", timeout=WAIT_S)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await client.infer("nobody", timeout=WAIT_S)
    assert answer.model_name == "cold"
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    cold, unknown = entries
    # The activator's own refusal names the call's id, as the log does.
    trailing = dict(refused.value.trailing_metadata() or ())
    assert trailing["x-request-id"] == unknown["request_id"]
    assert (cold["status"], cold["waited"]) == ("OK", True)
    assert isinstance(cold["wait_ms"], float) and cold["wait_ms"] > 0
    assert (unknown["model"], unknown["status"]) == (None, "NOT_FOUND")


async def test_a_stream_is_one_line_when_it_ends(entries: list[dict[str, object]], frontend: str):
    store = FakeStore()
    store.register("m")
    async with FakeWorker("w1") as worker:
        await place(store, "m", worker)
        async with grpc_activator(
            store, RecordingActivate(), access_log_format="json", grpc_frontend=frontend
        ) as client:
            stream = client.stream()
            for index in range(3):
                await stream.write(infer_request("m", request_id=str(index)))
            answers: list[pb.ModelStreamInferResponse] = []
            for _ in range(3):
                answer = await stream.read()
                assert isinstance(answer, pb.ModelStreamInferResponse)
                answers.append(answer)
            await stream.done_writing()
            assert await stream.code() == grpc.StatusCode.OK
    assert [a.infer_response.id for a in answers] == ["0", "1", "2"]
    [entry] = entries
    assert entry["target"] == "/inference.GRPCInferenceService/ModelStreamInfer"
    assert (entry["model"], entry["status"]) == ("m", "OK")
    assert entry["bytes_in"] == 3 * len(infer_request("m", request_id="0").SerializeToString())


async def test_calls_cut_short_are_logged_deadline_exceeded_or_cancelled(
    entries: list[dict[str, object]], frontend: str
):
    store = FakeStore()
    store.register("m")
    async with FakeWorker("w1") as worker:
        await place(store, "m", worker)
        worker.hold = asyncio.Event()  # no answer until the end
        async with grpc_activator(
            store, RecordingActivate(), access_log_format="json", grpc_frontend=frontend
        ) as client:
            with pytest.raises(grpc.aio.AioRpcError) as late:
                await client.infer("m", timeout=0.5)
            await wait_until(lambda: len(entries) == 1)
            call = client.raw("ModelInfer")(infer_request("m").SerializeToString(), timeout=WAIT_S)
            await wait_until(lambda: len(worker.requests) == 2)
            call.cancel()
            await wait_until(lambda: len(entries) == 2)
            stream = client.raw_stream()
            await stream.write(infer_request("m").SerializeToString())
            await wait_until(lambda: len(worker.requests) == 3)
            stream.cancel()
            await wait_until(lambda: len(entries) == 3)
            worker.hold.set()
    assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert [(entry["target"], entry["status"]) for entry in entries] == [
        ("/inference.GRPCInferenceService/ModelInfer", "DEADLINE_EXCEEDED"),
        ("/inference.GRPCInferenceService/ModelInfer", "CANCELLED"),
        ("/inference.GRPCInferenceService/ModelStreamInfer", "CANCELLED"),
    ]


async def test_with_the_log_off_nothing_is_written_and_ids_still_reach_the_worker(
    entries: list[dict[str, object]], frontend: str
):
    store = FakeStore()
    store.register("m")
    async with FakeWorker("w1") as worker:
        await place(store, "m", worker)
        async with grpc_activator(
            store, RecordingActivate(), access_log=False, grpc_frontend=frontend
        ) as client:
            await client.infer("m", timeout=WAIT_S)
    assert entries == []
    assert len(worker.metadata[0]["x-request-id"]) == 32


_VARYING = ("time", "latency_ms", "wait_ms")
"""What differs between two runs of the same calls: clocks."""


async def _calls_of_every_kind(
    frontend: str, made: NewKey, entries: list[dict[str, object]]
) -> list[dict[str, object]]:
    """The lines of the same calls, made with the key ``made``, on ``frontend`` (clocks
    left out)."""
    store = FakeStore()
    store.register("m")
    store.keys[made.key_id] = ApiKeyRecord(
        id=made.key_id, name="k", secret_sha256=made.secret_sha256, models=("*",)
    )
    bearer = ("authorization", f"Bearer {made.token}")
    written = len(entries)
    async with FakeWorker("w1") as worker:
        activate = PlaceOnActivate(store, [worker])
        async with grpc_activator(
            store, activate, access_log_format="json", auth="keys", grpc_frontend=frontend
        ) as client:
            await client.infer("m", metadata=(bearer, ("x-request-id", "cold-1")), timeout=WAIT_S)
            await client.infer("m", metadata=(bearer, ("x-request-id", "warm-2")), timeout=WAIT_S)
            with pytest.raises(grpc.aio.AioRpcError):
                await client.infer(
                    "nobody", metadata=(bearer, ("x-request-id", "none-3")), timeout=WAIT_S
                )
            with pytest.raises(grpc.aio.AioRpcError):
                await client.infer("m", metadata=(("x-request-id", "nokey-4"),), timeout=WAIT_S)
            metadata = await client.unary("ModelMetadata", pb.ModelMetadataResponse)(
                pb.ModelMetadataRequest(name="m"),
                metadata=(bearer, ("x-request-id", "meta-5")),
                timeout=WAIT_S,
            )
            assert metadata.name == "m"
            await client.unary("ServerLive", pb.ServerLiveResponse)(pb.ServerLiveRequest())
            stream = client.stream(metadata=(bearer, ("x-request-id", "stream-6")))
            for index in range(2):
                await stream.write(infer_request("m", request_id=str(index)))
                answer = await stream.read()
                assert isinstance(answer, pb.ModelStreamInferResponse)
                assert answer.infer_response.id == str(index)
            await stream.done_writing()
            assert await stream.code() == grpc.StatusCode.OK
    lines = [dict(entry) for entry in entries[written:]]
    for line in lines:
        for field in _VARYING:
            assert field in line
            del line[field]
    return lines


async def test_both_front_ends_write_the_same_lines(entries: list[dict[str, object]]):
    made = new_key()
    aio = await _calls_of_every_kind("aio", made, entries)
    h2corn = await _calls_of_every_kind("h2corn", made, entries)
    assert [line["request_id"] for line in aio] == [
        "cold-1",
        "warm-2",
        "none-3",
        "nokey-4",
        "meta-5",
        "stream-6",
    ]
    assert [(line["status"], line["waited"]) for line in aio] == [
        ("OK", True),
        ("OK", False),
        ("NOT_FOUND", False),
        ("UNAUTHENTICATED", False),
        ("OK", False),
        ("OK", False),
    ]
    assert [line["key_id"] for line in aio] == [made.key_id] * 3 + [None] + [made.key_id] * 2
    assert h2corn == aio
