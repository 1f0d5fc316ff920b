"""The access log of the activator's gRPC endpoint, and the request id it passes on to the
worker, over fake workers in process."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import grpc
import orjson
import pytest

from activator.access_log import ACCESS_LOGGER
from foundation.proto import grpc_service_pb2 as pb
from tests.activator.fakes import FakeStore, RecordingActivate
from tests.activator.grpc.conftest import (
    WAIT_S,
    PlaceOnActivate,
    grpc_activator,
    infer_request,
    place,
)
from tests.activator.grpc.fake_worker import FakeWorker

pytestmark = pytest.mark.anyio


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
    entries: list[dict[str, object]],
):
    store = FakeStore()
    store.register("m")
    async with FakeWorker("w1") as worker:
        await place(store, "m", worker)
        async with grpc_activator(store, RecordingActivate(), access_log_format="json") as client:
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
    entries: list[dict[str, object]],
):
    store = FakeStore()
    store.register("cold")
    async with FakeWorker("w1") as worker:
        activate = PlaceOnActivate(store, [worker])
        async with grpc_activator(store, activate, access_log_format="json") as client:
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


async def test_a_stream_is_one_line_when_it_ends(entries: list[dict[str, object]]):
    store = FakeStore()
    store.register("m")
    async with FakeWorker("w1") as worker:
        await place(store, "m", worker)
        async with grpc_activator(store, RecordingActivate(), access_log_format="json") as client:
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


async def test_with_the_log_off_nothing_is_written_and_ids_still_reach_the_worker(
    entries: list[dict[str, object]],
):
    store = FakeStore()
    store.register("m")
    async with FakeWorker("w1") as worker:
        await place(store, "m", worker)
        async with grpc_activator(store, RecordingActivate(), access_log=False) as client:
            await client.infer("m", timeout=WAIT_S)
    assert entries == []
    assert len(worker.metadata[0]["x-request-id"]) == 32
