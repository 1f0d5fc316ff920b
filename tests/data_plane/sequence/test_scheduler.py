"""The sequence batcher through ``submit()`` against a recording accumulator engine.

The engine adds ``INPUT`` to the implicit state ``ACC`` and answers the sum (``OUTPUT``, also
the next state); it records every batch it ran, control tensors included, and can hold its
executions on a gate so that requests pile up. Assertions are about answers, batch
composition and errors, never durations; the clock is injected.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format

from data_plane.batcher import BatchedResult
from data_plane.errors import InternalError, ServerStoppingError
from data_plane.sequence import (
    MissingCorrelationIdError,
    SequenceBacklogFullError,
    SequenceBatcher,
    SequenceBatchSizeError,
    SequenceCancelledError,
    SequenceNotStartedError,
    SequencePolicy,
    SequenceTimeoutError,
    read_states,
)
from data_plane.sequence.table import END, START
from foundation.proto.model_config_pb2 import ModelConfig
from foundation.sequence_config import normalize_sequence_batching
from runtimes.model_request import ModelRequest, RequestContext, RequestOutcome
from tests.fakes import FakeClock

pytestmark = pytest.mark.anyio

WAIT_S = 10.0

CONTROLS = """
control_input [
  { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
  { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
  { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
  { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
]
state [ { input_name: "ACC" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


def policy(
    strategy: str = "direct { }",
    *,
    max_batch_size: int = 2,
    lanes: int = 1,
    idle_us: int = 60_000_000,
    queue_bound: int = 64,
) -> SequencePolicy:
    config = text_format.Parse(
        f'name: "acc" max_batch_size: {max_batch_size} sequence_batching {{ {strategy} '
        f"max_sequence_idle_microseconds: {idle_us} {CONTROLS} }}",
        ModelConfig(),
    )
    normalize_sequence_batching(config)
    states = read_states(config, Path("/nonexistent"))
    return SequencePolicy.from_config(
        config, instance_count=lanes, states=states, queue_bound=queue_bound
    )


class Accumulator:
    """``OUTPUT = ACC + INPUT`` (the next ``ACC`` too); records batches; can be held."""

    def __init__(self, *, hold: bool = False) -> None:
        self.batches: list[dict[str, list[object]]] = []
        self.gate = asyncio.Event()
        if not hold:
            self.gate.set()
        self.fail_next = False
        self._ran = asyncio.Event()

    async def __call__(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.batches.append({name: array.reshape(-1).tolist() for name, array in batch.items()})
        self._ran.set()
        await self.gate.wait()
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("engine broke")
        total = batch["ACC"] + batch["INPUT"]
        return {"OUTPUT": total, "ACC_OUT": total}

    async def wait_batches(self, count: int) -> None:
        async with asyncio.timeout(WAIT_S):
            while len(self.batches) < count:
                self._ran.clear()
                await self._ran.wait()

    def column(self, name: str) -> list[list[object]]:
        return [batch[name] for batch in self.batches]


class RequestAccumulator(Accumulator):
    """The same engine taking separate requests (Triton's Python backend contract)."""

    def __init__(self, *, hold: bool = False) -> None:
        super().__init__(hold=hold)
        self.contexts: list[list[RequestContext]] = []

    async def execute_requests(self, requests: Sequence[ModelRequest]) -> list[RequestOutcome]:
        self.contexts.append([r.context for r in requests])
        merged = {
            name: np.concatenate([r.inputs[name] for r in requests]) for name in requests[0].inputs
        }
        outputs = await self(merged)
        return [{k: v[i : i + 1] for k, v in outputs.items()} for i in range(len(requests))]


@contextlib.asynccontextmanager
async def started(
    engine: Accumulator, rules: SequencePolicy, *, clock: FakeClock | None = None, **options: object
) -> AsyncIterator[SequenceBatcher]:
    batcher = SequenceBatcher(
        engine,
        rules,
        clock=(clock or FakeClock()).ns,
        **options,  # type: ignore[arg-type]
    )
    await batcher.start()
    try:
        yield batcher
    finally:
        await batcher.close(timeout_s=WAIT_S)


def send(
    batcher: SequenceBatcher, cid: int | str, value: int, flags: int = 0, **options: object
) -> asyncio.Task[BatchedResult]:
    """Submit one request now (its task queues it before the caller's next await)."""
    context = RequestContext(correlation_id=cid, flags=flags)
    inputs = {"INPUT": np.array([[value]], dtype=np.int32)}
    return asyncio.create_task(batcher.submit(inputs, context=context, **options))  # type: ignore[arg-type]


async def answer(task: asyncio.Task[BatchedResult]) -> int:
    async with asyncio.timeout(WAIT_S):
        result = await task
    return int(result.outputs["OUTPUT"].reshape(-1)[0])


async def settle() -> None:
    """Let every ready task run until none is (tasks queue their requests when they run)."""
    for _ in range(20):
        await asyncio.sleep(0)


@pytest.mark.parametrize("strategy", ["direct { }", "oldest { }"])
async def test_one_sequence_accumulates_and_sees_its_controls(strategy: str) -> None:
    engine = Accumulator()
    async with started(engine, policy(strategy)) as batcher:
        assert await answer(send(batcher, 7, 1, START)) == 1
        assert await answer(send(batcher, 7, 2)) == 3
        assert await answer(send(batcher, 7, 3, END)) == 6
        assert batcher.live_sequences == 0
    assert engine.column("START") == [[1], [0], [0]]
    assert engine.column("END") == [[0], [0], [1]]
    assert engine.column("READY") == [[1], [1], [1]]
    assert engine.column("CORRID") == [[7], [7], [7]]
    assert engine.column("ACC") == [[0], [1], [3]]


async def test_direct_keeps_each_sequence_in_its_row_with_fillers() -> None:
    engine = Accumulator(hold=True)
    async with started(engine, policy()) as batcher:
        first_a = send(batcher, 11, 10, START)
        await engine.wait_batches(1)  # 11 holds slot 0 and is executing
        first_b = send(batcher, 22, 1, START)
        second_b = send(batcher, 22, 2)
        await settle()
        engine.gate.set()
        assert [await answer(first_a), await answer(first_b), await answer(second_b)] == [10, 1, 3]
        assert await answer(send(batcher, 11, 5, END)) == 15
    # 22 took slot 1: its rows are the second of each batch, and slot 0 without a request
    # of 11 is a filler (READY 0, CORRID 0, START 0).
    rows = [(b["READY"], b["CORRID"], b["START"]) for b in engine.batches]
    assert rows == [
        ([1], [11], [1]),
        ([0, 1], [0, 22], [0, 1]),
        ([0, 1], [0, 22], [0, 0]),
        ([1], [11], [0]),
    ]


async def test_direct_sends_both_slots_together_when_both_have_requests() -> None:
    engine = Accumulator(hold=True)
    async with started(engine, policy()) as batcher:
        block = send(batcher, 1, 100, START | END)
        await engine.wait_batches(1)
        tasks = [send(batcher, 2, 1, START), send(batcher, 3, 1, START)]
        await settle()
        engine.gate.set()
        await answer(block)
        assert [await answer(t) for t in tasks] == [1, 1]
    # 2 took slot 1 (1 held slot 0), 3 waited and got slot 0 when 1 ended.
    assert engine.column("CORRID")[1] == [3, 2]
    assert engine.column("READY")[1] == [1, 1]


@pytest.mark.parametrize("strategy", ["direct { }", "oldest { max_candidate_sequences: 2 }"])
async def test_a_sequence_past_the_slots_waits_for_one_to_end(strategy: str) -> None:
    engine = Accumulator()
    async with started(engine, policy(strategy)) as batcher:
        assert await answer(send(batcher, 1, 1, START)) == 1
        assert await answer(send(batcher, 2, 2, START)) == 2
        waiting = send(batcher, 3, 3, START)
        follower = send(batcher, 3, 4, END)
        await settle()
        assert not waiting.done() and batcher.pending_count == 2
        assert await answer(send(batcher, 1, 1, END)) == 2
        assert [await answer(waiting), await answer(follower)] == [3, 7]
        assert await answer(send(batcher, 2, 0, END)) == 2


async def test_oldest_batches_at_most_one_request_per_sequence() -> None:
    engine = Accumulator(hold=True)
    rules = policy("oldest { max_candidate_sequences: 3 }", max_batch_size=4)
    async with started(engine, rules) as batcher:
        tasks: dict[int, list[asyncio.Task[BatchedResult]]] = {}
        for step in range(3):
            for cid in (1, 2, 3):
                flags = START if step == 0 else END if step == 2 else 0
                tasks.setdefault(cid, []).append(send(batcher, cid, cid, flags))
        await settle()
        engine.gate.set()
        totals = {cid: [await answer(t) for t in ts] for cid, ts in tasks.items()}
    assert totals == {1: [1, 2, 3], 2: [2, 4, 6], 3: [3, 6, 9]}
    for batch in engine.batches:
        assert len(set(batch["CORRID"])) == len(batch["CORRID"])
        assert set(batch["READY"]) == {1}


async def test_start_again_restarts_the_running_sequence() -> None:
    engine = Accumulator()
    async with started(engine, policy()) as batcher:
        assert await answer(send(batcher, 4, 4, START)) == 4
        assert await answer(send(batcher, 4, 4, START)) == 4
        assert await answer(send(batcher, 4, 4, END)) == 8


@pytest.mark.parametrize("strategy", ["direct { }", "oldest { }"])
async def test_bad_requests_get_tritons_errors(strategy: str) -> None:
    engine = Accumulator()
    async with started(engine, policy(strategy)) as batcher:
        with pytest.raises(MissingCorrelationIdError) as missing:
            await answer(send(batcher, 0, 1, START))
        assert missing.value.message == (
            "inference request to model 'acc' must specify a non-zero or non-empty correlation ID"
        )
        with pytest.raises(SequenceNotStartedError):
            await answer(send(batcher, 9, 1))
        rows = {"INPUT": np.zeros((2, 1), dtype=np.int32)}
        context = RequestContext(correlation_id=9, flags=START)
        with pytest.raises(SequenceBatchSizeError) as too_big:
            await batcher.submit(rows, context=context)
        assert too_big.value.message == (
            "inference request to model 'acc' must specify batch-size 1 due to requirements "
            "of sequence batcher"
        )
        assert await answer(send(batcher, 9, 1, START | END)) == 1
        with pytest.raises(SequenceNotStartedError):
            await answer(send(batcher, 9, 1, END))  # ended already
    assert len(engine.batches) == 1


@pytest.mark.parametrize("strategy", ["direct { }", "oldest { }"])
async def test_an_idle_sequence_ends_and_a_waiting_one_gets_its_slot(strategy: str) -> None:
    clock = FakeClock()
    engine = Accumulator()
    rules = policy(strategy, max_batch_size=0, idle_us=1_000)
    async with started(engine, rules, clock=clock) as batcher:
        assert await answer(send(batcher, 1, 1, START)) == 1
        waiting = send(batcher, 2, 5, START)
        await settle()
        assert not waiting.done() and batcher.live_sequences == 2
        clock.advance(ms=2)
        assert await answer(waiting) == 5  # sequence 1 went idle: its slot freed
        with pytest.raises(SequenceNotStartedError):
            await answer(send(batcher, 1, 1))


async def test_backlog_timeout_fails_the_waiting_sequence() -> None:
    clock = FakeClock()
    engine = Accumulator()
    async with started(engine, policy(max_batch_size=0), clock=clock) as batcher:
        assert await answer(send(batcher, 1, 1, START)) == 1
        waiting = send(batcher, 2, 5, START, timeout_us=1_000)
        await settle()
        clock.advance(ms=2)
        with pytest.raises(SequenceTimeoutError) as caught:
            await answer(waiting)
        assert caught.value.message == "timeout of the corresponding sequence has been expired"
        with pytest.raises(SequenceNotStartedError):
            await answer(send(batcher, 2, 5))


async def test_a_cancelled_request_ends_its_sequence() -> None:
    engine = Accumulator(hold=True)
    async with started(engine, policy()) as batcher:
        first = send(batcher, 1, 1, START)
        await engine.wait_batches(1)
        cancelled = send(batcher, 1, 2)
        follower = send(batcher, 1, 3)
        await settle()
        cancelled.cancel()
        await settle()
        engine.gate.set()
        assert await answer(first) == 1
        with pytest.raises(SequenceCancelledError):
            await answer(follower)
        with pytest.raises(SequenceNotStartedError):
            await answer(send(batcher, 1, 4))


async def test_an_engine_failure_fails_the_batch_and_the_sequence_goes_on() -> None:
    engine = Accumulator()
    async with started(engine, policy()) as batcher:
        assert await answer(send(batcher, 1, 1, START)) == 1
        engine.fail_next = True
        with pytest.raises(InternalError, match="engine broke"):
            await answer(send(batcher, 1, 2))
        assert await answer(send(batcher, 1, 3, END)) == 4  # state unchanged by the failure


async def test_queue_bound() -> None:
    engine = Accumulator(hold=True)
    async with started(engine, policy(max_batch_size=0, queue_bound=2)) as batcher:
        running = send(batcher, 1, 1, START)
        await engine.wait_batches(1)
        queued = [send(batcher, 1, 1), send(batcher, 1, 1)]
        await settle()
        with pytest.raises(SequenceBacklogFullError):
            await answer(send(batcher, 1, 1))
        engine.gate.set()
        await answer(running)
        for task in queued:
            await answer(task)


async def test_separate_requests_get_fillers_as_requests_that_are_not_ready() -> None:
    engine = RequestAccumulator(hold=True)
    async with started(engine, policy(), execute_requests=engine.execute_requests) as batcher:
        first = send(batcher, 1, 1, START)
        await engine.wait_batches(1)
        other = send(batcher, 2, 5, START)
        again = send(batcher, 1, 1, END)
        await settle()
        engine.gate.set()
        assert [await answer(t) for t in (first, other, again)] == [1, 5, 2]
        alone = send(batcher, 2, 1, END)
        assert await answer(alone) == 6
    last = engine.contexts[-1]
    assert [(c.correlation_id, c.flags) for c in last] == [(0, 0), (2, END)]
    assert engine.batches[-1]["READY"] == [0, 1]


async def test_close_drains_what_slots_hold_and_fails_the_backlog() -> None:
    engine = Accumulator(hold=True)
    batcher = SequenceBatcher(engine, policy(max_batch_size=0), clock=FakeClock().ns)
    await batcher.start()
    running = send(batcher, 1, 1, START)
    await engine.wait_batches(1)
    queued = send(batcher, 1, 2)
    waiting = send(batcher, 2, 1, START)
    await settle()
    closing = asyncio.create_task(batcher.close(timeout_s=0.05))
    await settle()
    with pytest.raises(ServerStoppingError):
        await answer(send(batcher, 3, 1, START))
    engine.gate.set()
    await closing
    assert await answer(running) == 1
    assert await answer(queued) == 3
    with pytest.raises(ServerStoppingError):
        await answer(waiting)
