"""A decoupled ensemble's request through its steps, in process: recording steps stand
for plain models, and real :class:`ResponseStream` objects, fed by a coroutine sending
responses, for decoupled ones. Each response of a decoupled step runs the steps after it
again and goes out as a response of the ensemble; the last is final."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import cast

import numpy as np
import pytest

from data_plane.ensemble.scheduler import BoundStep, Ensemble
from data_plane.ensemble.streaming import Graph, StepRunners, StreamedRun
from data_plane.errors import InvalidArgumentError
from data_plane.model_version import LoadedVersion
from data_plane.protocol import InferRequest, OutputTensor, RequestedOutput
from data_plane.response_stream import ResponseStream
from data_plane.stats import ComputeTimes
from runtimes.model_request import RequestContext, StreamedResponse
from tests.data_plane.ensemble.test_scheduler import Models, bound, doubled, request

pytestmark = pytest.mark.anyio

WAIT_S = 10.0

Responses = Callable[[InferRequest], list[StreamedResponse]]


def streaming(index: int, model: str, inputs: dict[str, str], outputs: dict[str, str]) -> BoundStep:
    return bound(index, model, inputs, outputs, is_decoupled=True)


def repeat(sent: InferRequest) -> list[StreamedResponse]:
    """One response per element of the input, then a bare final flag (as Triton's
    repeat_int32 example sends them)."""
    values = sent.inputs[0].data
    answers = [StreamedResponse({"Y": np.array([v], np.float32)}) for v in values]
    return [*answers, StreamedResponse({}, None, True)]


class Streams:
    """Decoupled models by name, opened as the data plane opens them; the contexts of
    the requests sent, to see what the models were told."""

    def __init__(self, **models: Responses) -> None:
        self.models = models
        self.contexts: list[RequestContext] = []
        self.held = asyncio.Event()
        """Set to let a model send past its first response (set by default)."""
        self.held.set()

    def open(self, model: LoadedVersion, sent: InferRequest, times: ComputeTimes) -> ResponseStream:
        responses = self.models[cast(str, model)](sent)

        async def start(context: RequestContext) -> None:
            self.contexts.append(context)
            assert context.responses is not None
            for number, response in enumerate(responses):
                if number == 1:
                    await asyncio.wait_for(self.held.wait(), WAIT_S)
                if context.is_cancelled():
                    return
                room = asyncio.Event()
                context.responses(response, room.set)
                await asyncio.wait_for(room.wait(), WAIT_S)

        def select(produced: Mapping[str, np.ndarray]) -> list[OutputTensor]:
            return [OutputTensor(n, "FP32", a, binary=False) for n, a in produced.items()]

        return ResponseStream(cast(str, model), RequestContext(), start, select)


async def collect(
    ensemble: Ensemble, models: Models, streams: Streams, data: list[float], **fields: object
) -> list[StreamedResponse]:
    stream = ensemble.stream(
        {"IN": np.array(data, np.float32)},
        request(**fields),
        models.run_step,
        streams.open,
        ComputeTimes(),
    )
    async with asyncio.timeout(WAIT_S):
        return [response async for response in stream]


def lookup(models: Models, streams: Streams) -> Callable[..., LoadedVersion]:
    def find(name: str, version: int | None = None) -> LoadedVersion:
        return cast(LoadedVersion, name) if name in streams.models else models.lookup(name)

    return find


def chain(models: Models, streams: Streams, *steps: BoundStep) -> Ensemble:
    return Ensemble("chain", steps, {"IN": "FP32"}, ["OUT"], lookup(models, streams))


REPEAT_THEN_DOUBLE = (
    streaming(0, "repeat", {"X": "IN"}, {"Y": "a"}),
    bound(1, "double", {"X": "a"}, {"Y": "OUT"}),
)


def repeat_then_double() -> tuple[Ensemble, Models, Streams]:
    """``repeat`` (decoupled), then ``double`` (plain) of each of its responses."""
    models, streams = Models(double=doubled("X", "Y")), Streams(repeat=repeat)
    return chain(models, streams, *REPEAT_THEN_DOUBLE), models, streams


def values(responses: list[StreamedResponse]) -> list[tuple[dict[str, list[float]], bool]]:
    return [
        ({n: a.tolist() for n, a in r.outputs.items()}, r.is_final)
        for r in responses
        if r.error is None
    ]


async def test_each_response_of_a_decoupled_step_runs_the_next_step_and_goes_out():
    ensemble, models, streams = repeat_then_double()

    responses = await collect(ensemble, models, streams, [1.0, 2.0, 3.0])

    assert sorted(v["OUT"][0] for v, _ in values(responses) if v) == [2.0, 4.0, 6.0]
    # One final flag, on the last message (a response or a bare flag after it).
    assert [final for _, final in values(responses)].count(True) == 1
    assert responses[-1].is_final
    assert [name for name, _ in models.requests] == ["double"] * 3


async def test_a_decoupled_step_without_responses_ends_with_a_bare_final_flag():
    ensemble, models, streams = repeat_then_double()

    responses = await collect(ensemble, models, streams, [])

    assert values(responses) == [({}, True)]
    assert models.requests == []


async def test_two_decoupled_steps_in_a_chain_multiply_the_responses():
    models, streams = Models(), Streams(repeat=repeat, again=repeat)
    ensemble = chain(
        models,
        streams,
        streaming(0, "repeat", {"X": "IN"}, {"Y": "a"}),
        streaming(1, "again", {"X": "a"}, {"Y": "OUT"}),
    )

    responses = await collect(ensemble, models, streams, [5.0, 7.0])

    assert sorted(v["OUT"][0] for v, _ in values(responses) if v) == [5.0, 7.0]
    assert responses[-1].is_final


async def test_a_failing_step_ends_the_stream_with_its_error_and_cancels_the_others():
    async def picky(sent: InferRequest) -> dict[str, np.ndarray]:
        if sent.inputs[0].data[0] < 0:
            raise InvalidArgumentError("negative")
        return {"Y": sent.inputs[0].data}

    models, streams = Models(picky=picky), Streams(repeat=repeat)
    streams.held.clear()  # the decoupled step still has responses to send
    ensemble = chain(
        models,
        streams,
        streaming(0, "repeat", {"X": "IN"}, {"Y": "a"}),
        bound(1, "picky", {"X": "a"}, {"Y": "OUT"}),
    )

    responses = await collect(ensemble, models, streams, [-1.0, 2.0])

    (failure,) = responses
    assert failure.is_final and isinstance(failure.error, InvalidArgumentError)
    assert failure.error.message == "in ensemble 'chain', negative"
    assert streams.contexts[0].is_cancelled()


async def test_closing_the_stream_early_cancels_the_decoupled_step():
    ensemble, models, streams = repeat_then_double()
    streams.held.clear()
    stream = ensemble.stream(
        {"IN": np.array([1.0, 2.0], np.float32)},
        request(),
        models.run_step,
        streams.open,
        ComputeTimes(),
    )

    async with asyncio.timeout(WAIT_S):
        first = await anext(stream)
        await stream.aclose()
        await ensemble.wait_idle(WAIT_S)

    assert first.outputs["OUT"].tolist() == [2.0] and not first.is_final
    assert streams.contexts[0].is_cancelled()
    assert ensemble.running_count == 0


async def test_only_the_requested_outputs_go_out_and_every_value_is_dropped_once_read():
    models, streams = Models(double=doubled("X", "Y")), Streams(repeat=repeat)
    graph = Graph(
        "chain",
        REPEAT_THEN_DOUBLE,
        {"IN": (0,), "a": (1,)},
        {"IN": "FP32"},
        lookup(models, streams),
    )
    runners = StepRunners(models.run_step, streams.open, ComputeTimes())
    run = StreamedRun(graph, request(outputs=[RequestedOutput("a")]), ["a"], runners)

    async with asyncio.timeout(WAIT_S):
        responses = [r async for r in run.responses({"IN": np.array([1.0, 2.0], np.float32)})]

    assert sorted(v["a"][0] for v, _ in values(responses) if v) == [1.0, 2.0]
    assert all(set(r.outputs) <= {"a"} for r in responses)
    assert run.held_count == 0
