"""ModelStreamInfer through the activator in process: from zero, several models on one
stream, failures answered in the stream, broken workers, the in-flight bound, cancellation."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from activator.grpc.worker_stream import error_response
from foundation.proto import grpc_service_pb2 as pb
from tests.activator.fakes import FakeStore, RecordingActivate
from tests.activator.grpc.conftest import (
    WAIT_S,
    Client,
    PlaceOnActivate,
    answered_by,
    grpc_activator,
    infer_request,
    place,
    wait_until,
)
from tests.activator.grpc.fake_worker import FakeWorker

pytestmark = pytest.mark.anyio


async def _read(call: object, count: int) -> list[pb.ModelStreamInferResponse]:
    responses = []
    async with asyncio.timeout(WAIT_S):
        for _ in range(count):
            response = await call.read()  # type: ignore[attr-defined]
            assert response is not grpc.aio.EOF
            responses.append(response)
    return responses


async def _finish(call: object) -> None:
    await call.done_writing()  # type: ignore[attr-defined]
    async with asyncio.timeout(WAIT_S):
        assert await call.read() is grpc.aio.EOF  # type: ignore[attr-defined]
        assert await call.code() == grpc.StatusCode.OK  # type: ignore[attr-defined]


def _settled(client: Client, *models: str) -> bool:
    parts = client.core.parts
    return all(parts.traffic.in_flight(m) == 0 for m in models) and all(
        r.in_flight == 0 for m in models for r in parts.table.replicas(m)
    )


async def test_a_stream_from_zero_waits_for_one_activation_and_passes_every_request() -> None:
    store = FakeStore()
    store.register("m")
    async with FakeWorker("w1") as worker:
        gate = asyncio.Event()
        activate = PlaceOnActivate(store, [worker], gate=gate)
        async with grpc_activator(store, activate) as client:
            call = client.stream()
            for i in range(10):
                await call.write(infer_request("m", request_id=str(i), payload=bytes([i])))
            await asyncio.wait_for(activate.called.wait(), WAIT_S)
            gate.set()
            responses = await _read(call, 10)
            await _finish(call)
            await wait_until(lambda: _settled(client, "m"))
    assert activate.calls == ["m"]
    assert worker.streams_opened == 1
    assert [r.infer_response.id for r in responses] == [str(i) for i in range(10)]
    assert [r.infer_response.raw_output_contents[0] for r in responses] == [
        bytes([i]) for i in range(10)
    ]
    assert all(not r.error_message for r in responses)


async def test_each_model_on_a_stream_gets_its_own_worker_stream() -> None:
    store = FakeStore()
    store.register("a")
    store.register("b")
    async with FakeWorker("wa") as wa, FakeWorker("wb") as wb:
        async with grpc_activator(store, RecordingActivate()) as client:
            await place(store, "a", wa)
            await place(store, "b", wb)
            await wait_until(lambda: len(client.core.parts.table.models()) == 2)
            call = client.stream()
            for i, model in enumerate("abab"):
                await call.write(infer_request(model, request_id=f"{model}{i}"))
            responses = await _read(call, 4)
            await _finish(call)
    by_id = {r.infer_response.id: answered_by(r.infer_response) for r in responses}
    assert by_id == {"a0": "wa", "b1": "wb", "a2": "wa", "b3": "wb"}
    assert (wa.streams_opened, wb.streams_opened) == (1, 1)


async def test_unroutable_requests_are_answered_in_the_stream_which_goes_on() -> None:
    store = FakeStore()
    store.register("m")
    async with FakeWorker("w1") as worker:
        async with grpc_activator(store, PlaceOnActivate(store, [worker])) as client:
            call = client.stream()
            await call.write(infer_request("nope", request_id="x"))
            await call.write(infer_request("m", request_id="y"))
            await call.write(infer_request("m", request_id="fail-z"))  # the worker fails it
            responses = await _read(call, 3)
            await _finish(call)
    by_id = {r.infer_response.id: r.error_message for r in responses}
    assert by_id == {
        "x": "Request for unknown model: 'nope' is not found",
        "y": "",
        "fail-z": "failed fail-z",
    }


async def test_a_full_buffer_fails_the_streams_request_not_the_stream() -> None:
    store = FakeStore()
    store.register("m")
    activate = RecordingActivate(gate=asyncio.Event())
    async with grpc_activator(store, activate, buffer_max_requests=1) as client:
        blocker = asyncio.ensure_future(client.infer("m"))
        await wait_until(lambda: client.core.parts.buffer.waiting("m") == 1)
        call = client.stream()
        await call.write(infer_request("m", request_id="s1"))
        (response,) = await _read(call, 1)
        call.cancel()
        blocker.cancel()
        await asyncio.gather(blocker, return_exceptions=True)
    assert response.infer_response.id == "s1"
    assert "request buffer is full" in response.error_message


async def test_a_worker_that_dies_fails_what_it_held_and_the_lane_routes_again() -> None:
    store = FakeStore()
    store.register("m")
    async with FakeWorker("w1") as w1, FakeWorker("w2") as w2:
        w1.hold = asyncio.Event()
        async with grpc_activator(store, RecordingActivate()) as client:
            await place(store, "m", w1)
            await wait_until(lambda: len(client.core.parts.table.replicas("m")) == 1)
            call = client.stream()
            await call.write(infer_request("m", request_id="held-1"))
            await call.write(infer_request("m", request_id="held-2"))
            await wait_until(lambda: len(w1.requests) == 1)
            await store.remove_placement("m", "w1")
            await place(store, "m", w2)
            await w1.stop(None)
            failed = await _read(call, 2)
            await call.write(infer_request("m", request_id="after"))
            (after,) = await _read(call, 1)
            await _finish(call)
            await wait_until(lambda: _settled(client, "m"))
    assert sorted(r.infer_response.id for r in failed) == ["held-1", "held-2"]
    for response in failed:
        assert f"model 'm': worker {w1.address} failed:" in response.error_message
    assert (after.infer_response.id, after.error_message) == ("after", "")
    assert answered_by(after.infer_response) == "w2"


async def test_a_worker_silent_past_the_read_timeout_fails_its_pending_requests() -> None:
    store = FakeStore()
    store.register("m")
    async with FakeWorker("w1") as worker:
        worker.hold = asyncio.Event()
        activate = PlaceOnActivate(store, [worker])
        async with grpc_activator(store, activate, upstream_read_timeout_s=0.3) as client:
            call = client.stream()
            await call.write(infer_request("m", request_id="slow"))
            (response,) = await _read(call, 1)
            call.cancel()
            await wait_until(lambda: _settled(client, "m"))
    assert response.infer_response.id == "slow"
    assert response.error_message == (
        f"model 'm': worker {worker.address} did not answer within 0.3 s"
    )


async def test_a_message_that_is_no_request_ends_the_stream_after_the_answers() -> None:
    store = FakeStore()
    store.register("m")
    async with FakeWorker("w1") as worker:
        async with grpc_activator(store, PlaceOnActivate(store, [worker])) as client:
            raw = client.raw_stream()
            await raw.write(infer_request("m", request_id="ok").SerializeToString())
            await raw.write(b"\x0a\x09short")
            answer = await asyncio.wait_for(raw.read(), WAIT_S)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await asyncio.wait_for(raw.read(), WAIT_S)
    assert isinstance(answer, bytes)
    assert pb.ModelStreamInferResponse.FromString(answer).infer_response.id == "ok"
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    assert caught.value.details() == "Unable to parse request"


async def test_a_stream_reads_no_further_than_its_in_flight_bound() -> None:
    store = FakeStore()
    store.register("m")
    async with FakeWorker("w1") as worker:
        worker.hold = asyncio.Event()
        activate = PlaceOnActivate(store, [worker])
        async with grpc_activator(store, activate, grpc_stream_max_in_flight=2) as client:
            call = client.stream()
            for i in range(6):
                await call.write(infer_request("m", request_id=str(i)))
            # Two are taken (one at the worker, one on its way); the rest wait unread in
            # gRPC's flow control, not in the activator, however long the worker takes.
            await wait_until(lambda: client.core.parts.traffic.in_flight("m") == 2)
            await asyncio.sleep(0.2)
            assert client.core.parts.traffic.in_flight("m") == 2
            assert len(worker.requests) == 1
            worker.hold.set()
            responses = await _read(call, 6)
            await _finish(call)
    assert [r.infer_response.id for r in responses] == [str(i) for i in range(6)]


async def test_a_client_that_cancels_its_stream_cancels_the_worker_stream() -> None:
    store = FakeStore()
    store.register("m")
    async with FakeWorker("w1") as worker:
        worker.hold = asyncio.Event()
        async with grpc_activator(store, PlaceOnActivate(store, [worker])) as client:
            call = client.stream()
            await call.write(infer_request("m", request_id="1"))
            await asyncio.wait_for(worker.started.wait(), WAIT_S)
            call.cancel()
            await wait_until(lambda: worker.cancelled == 1)
            await wait_until(lambda: _settled(client, "m"))


def test_an_error_response_carries_the_message_and_the_id() -> None:
    response = pb.ModelStreamInferResponse.FromString(error_response("boom", "r7"))
    assert (response.error_message, response.infer_response.id) == ("boom", "r7")
