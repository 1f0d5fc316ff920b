"""Sequence models through the activator's gRPC listener, over two fake workers: every
request of a sequence (its ``sequence_id`` parameter) reaches the replica that took its
START, on unary ModelInfer and on a ModelStreamInfer stream carrying several sequences;
END drops the binding; a sequence whose replica went away gets FAILED_PRECONDITION saying
its state is lost, and a new START rebinds it; the parameters are read off the wire as
protobuf writes them."""

from __future__ import annotations

import asyncio
import collections

import grpc
import pytest

from activator.grpc.wire import sequence_tag
from activator.sequences import SequenceTag
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

_STEPS = 4


def _step(
    model: str, correlation_id: int | str, *, start: bool = False, end: bool = False, rid: str = ""
) -> pb.ModelInferRequest:
    request = infer_request(model, request_id=rid)
    if isinstance(correlation_id, str):
        request.parameters["sequence_id"].string_param = correlation_id
    else:
        request.parameters["sequence_id"].uint64_param = correlation_id
    request.parameters["sequence_start"].bool_param = start
    request.parameters["sequence_end"].bool_param = end
    return request


async def _infer(client: Client, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
    call = client.unary("ModelInfer", pb.ModelInferResponse)
    response: pb.ModelInferResponse = await call(request, timeout=WAIT_S)
    return response


async def _read(
    call: grpc.aio.StreamStreamCall[object, pb.ModelStreamInferResponse],
) -> pb.ModelStreamInferResponse:
    response = await asyncio.wait_for(call.read(), WAIT_S)
    assert isinstance(response, pb.ModelStreamInferResponse)
    return response


def _ids() -> list[int | str]:
    return [*range(1, 9), *(f"seq-{n}" for n in range(8))]


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        ({}, None),
        ({"sequence_id": ("uint64_param", 7)}, SequenceTag(7, is_start=False, is_end=False)),
        (
            {"sequence_id": ("int64_param", -5), "sequence_start": ("bool_param", True)},
            SequenceTag((1 << 64) - 5, is_start=True, is_end=False),
        ),
        (
            {"sequence_id": ("string_param", "abc"), "sequence_end": ("bool_param", True)},
            SequenceTag("abc", is_start=False, is_end=True),
        ),
        ({"sequence_id": ("uint64_param", 0)}, None),
        ({"sequence_id": ("string_param", "")}, None),
        ({"sequence_id": ("bool_param", True)}, None),
        (
            {"sequence_id": ("uint64_param", 3), "sequence_start": ("int64_param", 1)},
            SequenceTag(3, is_start=False, is_end=False),
        ),
        ({"other": ("string_param", "sequence_id")}, None),
    ],
)
def test_the_sequence_parameters_are_read_off_the_wire(
    parameters: dict[str, tuple[str, object]], expected: SequenceTag | None
) -> None:
    request = infer_request("m", payload=b"sequence_id" * 10)
    for name, (field, value) in parameters.items():
        setattr(request.parameters[name], field, value)
    request.parameters["unrelated"].double_param = 2.5
    assert sequence_tag(request.SerializeToString()) == expected


def test_unreadable_parameters_are_left_to_the_worker() -> None:
    data = _step("m", 9, start=True).SerializeToString()
    assert sequence_tag(data[: data.index(b"sequence_id") + 5]) is None


async def test_unary_steps_of_interleaved_sequences_each_land_on_their_starting_replica() -> None:
    store = FakeStore()
    store.register("m")
    async with FakeWorker("w1") as w1, FakeWorker("w2") as w2:
        async with grpc_activator(store, RecordingActivate()) as client:
            await place(store, "m", w1)
            await place(store, "m", w2)
            await wait_until(lambda: len(client.core.parts.table.replicas("m")) == 2)
            homes: dict[int | str, set[str]] = collections.defaultdict(set)
            for step in range(_STEPS):
                # Concurrent steps of every sequence, one step per sequence at a time.
                requests = [
                    _step("m", cid, start=step == 0, end=step == _STEPS - 1) for cid in _ids()
                ]
                responses = await asyncio.gather(*(_infer(client, r) for r in requests))
                for cid, response in zip(_ids(), responses, strict=True):
                    homes[cid].add(answered_by(response))
                if step == 0:
                    assert len(client.core.parts.sequences) == len(_ids())
            assert len(client.core.parts.sequences) == 0
            plain = [answered_by(await client.infer("m")) for _ in range(4)]
    assert all(len(home) == 1 for home in homes.values())
    assert collections.Counter(home.pop() for home in homes.values()).keys() == {"w1", "w2"}
    assert set(plain) == {"w1", "w2"}


async def test_a_sequence_whose_replica_went_away_fails_precondition_until_it_starts_again() -> (
    None
):
    store = FakeStore()
    store.register("m")
    async with FakeWorker("w1") as w1, FakeWorker("w2") as w2:
        async with grpc_activator(store, RecordingActivate()) as client:
            await place(store, "m", w1)
            await place(store, "m", w2)
            await wait_until(lambda: len(client.core.parts.table.replicas("m")) == 2)
            starts = {
                cid: answered_by(await _infer(client, _step("m", cid, start=True)))
                for cid in _ids()
            }
            lost = [cid for cid, worker in starts.items() if worker == "w2"]
            kept = [cid for cid, worker in starts.items() if worker == "w1"]
            assert lost and kept
            await store.remove_placement("m", "w2")
            await wait_until(lambda: len(client.core.parts.table.replicas("m")) == 1)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await _infer(client, _step("m", lost[0]))
            for cid in kept:
                assert answered_by(await _infer(client, _step("m", cid))) == "w1"
            again = answered_by(await _infer(client, _step("m", lost[0], start=True)))
            after = answered_by(await _infer(client, _step("m", lost[0], end=True)))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert caught.value.details() == (
        f"sequence {lost[0]} of model 'm' was running on worker w2, which no longer serves "
        "the model: its state is lost; start the sequence again (sequence_start)"
    )
    assert again == after == "w1"


async def test_a_sequence_started_at_zero_is_bound_where_the_activation_placed_it() -> None:
    store = FakeStore()
    store.register("m")
    async with FakeWorker("w1") as w1:
        async with grpc_activator(store, PlaceOnActivate(store, [w1])) as client:
            first = await _infer(client, _step("m", 42, start=True))
            second = await _infer(client, _step("m", 42))
            assert client.core.parts.sequences.worker_of("m", 42) == "w1"
    assert answered_by(first) == answered_by(second) == "w1"


async def test_a_stream_carrying_several_sequences_sends_each_to_its_replica() -> None:
    store = FakeStore()
    store.register("m")
    async with FakeWorker("w1") as w1, FakeWorker("w2") as w2:
        async with grpc_activator(store, RecordingActivate()) as client:
            await place(store, "m", w1)
            await place(store, "m", w2)
            await wait_until(lambda: len(client.core.parts.table.replicas("m")) == 2)
            call = client.stream()
            sent = 0
            for step in range(_STEPS):
                for cid in _ids():
                    request = _step(
                        "m", cid, start=step == 0, end=step == _STEPS - 1, rid=f"{cid}/{step}"
                    )
                    await call.write(request)
                    sent += 1
            await call.done_writing()
            responses = [await _read(call) for _ in range(sent)]
            assert await call.code() == grpc.StatusCode.OK
            assert len(client.core.parts.sequences) == 0
    homes: dict[str, set[str]] = collections.defaultdict(set)
    order: dict[str, list[int]] = collections.defaultdict(list)
    for response in responses:
        assert not response.error_message
        cid, index = response.infer_response.id.split("/")
        homes[cid].add(answered_by(response.infer_response))
        order[cid].append(int(index))
    assert all(len(home) == 1 for home in homes.values())
    assert {next(iter(home)) for home in homes.values()} == {"w1", "w2"}
    assert all(steps == list(range(_STEPS)) for steps in order.values())
    # Per worker, the steps of each sequence arrived in order.
    for worker in (w1, w2):
        seen: dict[str, list[int]] = collections.defaultdict(list)
        for request in worker.requests:
            cid, index = request.id.split("/")
            seen[cid].append(int(index))
        assert all(steps == sorted(steps) for steps in seen.values())


async def test_a_streamed_sequence_whose_replica_went_away_gets_an_error_response() -> None:
    store = FakeStore()
    store.register("m")
    async with FakeWorker("w1") as w1, FakeWorker("w2") as w2:
        async with grpc_activator(store, RecordingActivate()) as client:
            await place(store, "m", w1)
            await place(store, "m", w2)
            await wait_until(lambda: len(client.core.parts.table.replicas("m")) == 2)
            starts = {
                cid: answered_by(await _infer(client, _step("m", cid, start=True)))
                for cid in _ids()
            }
            lost = next(cid for cid, worker in starts.items() if worker == "w2")
            kept = next(cid for cid, worker in starts.items() if worker == "w1")
            await store.remove_placement("m", "w2")
            await wait_until(lambda: len(client.core.parts.table.replicas("m")) == 1)
            call = client.stream()
            await call.write(_step("m", lost, rid="lost"))
            await call.write(_step("m", kept, rid="kept"))
            await call.write(_step("m", lost, start=True, rid="restart"))
            await call.done_writing()
            responses: dict[str, pb.ModelStreamInferResponse] = {}
            for _ in range(3):
                response = await _read(call)
                responses[response.infer_response.id] = response
            assert await call.code() == grpc.StatusCode.OK
    assert responses["lost"].error_message == (
        f"sequence {lost} of model 'm' was running on worker w2, which no longer serves "
        "the model: its state is lost; start the sequence again (sequence_start)"
    )
    assert answered_by(responses["kept"].infer_response) == "w1"
    assert answered_by(responses["restart"].infer_response) == "w1"
