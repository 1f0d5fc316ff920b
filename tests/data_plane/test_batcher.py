"""The dynamic batcher, driven only through ``submit()`` against a recording fake engine.

Request ``k`` sends rows filled with the value ``k``; the fake engine answers
``y = x * 2 + 1`` and records, per execution, which request each row came from. So a
request that gets ``2k + 1`` everywhere, in its own shape, got exactly its own rows.
Waits are bounded and assertions are about composition and order, never durations.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping

import numpy as np
import pytest
from google.protobuf import text_format
from hypothesis import HealthCheck, given, settings, strategies as st

from data_plane.batcher import BatchedResult, Batcher, BatchPolicy, QueuePolicy
from data_plane.errors import (
    InternalError,
    InvalidArgumentError,
    ModelNotReadyError,
    QueueFullError,
    RequestTimeoutError,
    ServerStoppingError,
)
from foundation.proto.model_config_pb2 import ModelConfig
from tests.fakes import FakeClock

pytestmark = pytest.mark.anyio

SECOND_US = 1_000_000


class RecordingEngine:
    """A fake engine: ``y = x * 2 + 1``; records batches; can hold executions on a gate."""

    def __init__(self, *, hold: bool = False, clock: FakeClock | None = None) -> None:
        self.calls: list[Mapping[str, np.ndarray]] = []
        self.gate = asyncio.Event()
        if not hold:
            self.gate.set()
        self.running = 0
        self.max_running = 0
        self.errors: list[BaseException] = []
        self.outputs: Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]] | None = None
        self.clock = clock
        self.compute_ms = 0.0
        self._called = asyncio.Event()

    @property
    def batches(self) -> list[list[int]]:
        """Per execution, the request ids in row order (a request's rows counted once)."""
        result = []
        for call in self.calls:
            ids: list[int] = []
            for row in call["x"].reshape(len(call["x"]), -1)[:, 0]:
                if not ids or ids[-1] != int(row):
                    ids.append(int(row))
            result.append(ids)
        return result

    def release(self) -> None:
        self.gate.set()

    async def wait_calls(self, count: int) -> None:
        async with asyncio.timeout(5):
            while len(self.calls) < count:
                self._called.clear()
                await self._called.wait()

    async def __call__(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls.append(batch)
        self._called.set()
        if self.clock is not None:
            self.clock.advance(ms=self.compute_ms)
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            await self.gate.wait()
        finally:
            self.running -= 1
        if self.errors:
            raise self.errors.pop(0)
        if self.outputs is not None:
            return self.outputs(batch)
        return {"y": batch["x"] * 2 + 1}


def rows(request: int, count: int = 1, width: int = 2) -> dict[str, np.ndarray]:
    return {"x": np.full((count, width), float(request))}


async def settle() -> None:
    """Let every ready task run; the batcher reacts within a few loop iterations."""
    for _ in range(20):
        await asyncio.sleep(0)


def batcher_tasks() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("batcher-instance-")]


@contextlib.asynccontextmanager
async def serving(
    engine: RecordingEngine,
    policy: BatchPolicy,
    *,
    clock: Callable[[], int] = time.monotonic_ns,
    on_execution: Callable[[int, int], None] | None = None,
) -> AsyncIterator[Batcher]:
    batcher = Batcher(engine, policy, clock=clock, on_execution=on_execution)
    await batcher.start()
    try:
        yield batcher
    finally:
        engine.release()
        await batcher.close(timeout_s=5)


def submit(
    batcher: Batcher,
    inputs: Mapping[str, np.ndarray],
    *,
    priority: int = 0,
    timeout_us: int = 0,
    request_id: str | None = None,
) -> asyncio.Task[BatchedResult]:
    return asyncio.create_task(
        batcher.submit(inputs, priority=priority, timeout_us=timeout_us, request_id=request_id)
    )


async def finish(*tasks: asyncio.Task[BatchedResult]) -> list[BatchedResult]:
    async with asyncio.timeout(5):
        return list(await asyncio.gather(*tasks))


def assert_own_rows(result: BatchedResult, request: int, count: int = 1, width: int = 2) -> None:
    np.testing.assert_array_equal(result.outputs["y"], np.full((count, width), 2.0 * request + 1))


# --- the property: every request gets exactly its own rows -----------------------------


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, object]:
    max_batch = draw(st.integers(1, 6))
    levels = draw(st.integers(0, 3))
    return {
        "policy": BatchPolicy(
            max_batch_size=max_batch,
            preferred_batch_sizes=tuple(draw(st.lists(st.integers(1, max_batch), max_size=3))),
            max_queue_delay_us=draw(st.sampled_from([0, 0, 300])),
            priority_levels=levels,
            default_priority_level=draw(st.integers(1, levels)) if levels else 0,
            instance_count=draw(st.integers(1, 3)),
        ),
        # (rows, non-batch shape, priority, loop turns before the next submit)
        "requests": draw(
            st.lists(
                st.tuples(
                    st.integers(1, max_batch),
                    st.sampled_from([(2,), (3,), (2, 2)]),
                    st.integers(0, levels + 1),
                    st.integers(0, 2),
                ),
                min_size=1,
                max_size=20,
            )
        ),
        "engine_turns": draw(st.lists(st.integers(0, 3), max_size=20)),
    }


@settings(
    max_examples=80,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(scenario=scenarios())
async def test_every_request_gets_its_own_rows_in_valid_batches(scenario):
    policy: BatchPolicy = scenario["policy"]
    turns = list(scenario["engine_turns"])
    executions: list[list[int]] = []

    async def engine(batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = batch["x"]
        executions.append([int(v) for v in x.reshape(len(x), -1)[:, 0]])
        for _ in range(turns.pop(0) if turns else 0):
            await asyncio.sleep(0)
        return {"y": x * 2 + 1}

    batcher = Batcher(engine, policy)
    await batcher.start()
    tasks = []
    level_of = {}
    for ident, (count, shape, priority, pause) in enumerate(scenario["requests"]):
        inputs = {"x": np.full((count, *shape), float(ident))}
        tasks.append(asyncio.create_task(batcher.submit(inputs, priority=priority)))
        is_own_level = 0 < priority <= policy.priority_levels
        level_of[ident] = priority if is_own_level else policy.default_priority_level
        for _ in range(pause):
            await asyncio.sleep(0)
    results = await finish(*tasks)
    await batcher.close(timeout_s=5)

    for ident, ((count, shape, _, _), result) in enumerate(
        zip(scenario["requests"], results, strict=True)
    ):
        np.testing.assert_array_equal(
            result.outputs["y"], np.full((count, *shape), 2.0 * ident + 1)
        )
    batch_of: dict[int, int] = {}
    for index, rows_of in enumerate(executions):
        assert len(rows_of) <= policy.max_batch_size
        shapes = {scenario["requests"][ident][1] for ident in rows_of}
        assert len(shapes) == 1
        for ident in dict.fromkeys(rows_of):
            assert ident not in batch_of
            batch_of[ident] = index
            assert rows_of.count(ident) == scenario["requests"][ident][0]
            assert results[ident].batch_size == len(rows_of)
        in_walk_order = [level_of[ident] for ident in dict.fromkeys(rows_of)]
        assert in_walk_order == sorted(in_walk_order)
    assert sorted(batch_of) == list(range(len(tasks)))
    for level in set(level_of.values()):
        same_level = [ident for ident in level_of if level_of[ident] == level]
        assert [batch_of[i] for i in same_level] == sorted(batch_of[i] for i in same_level)
    assert batcher.pending_count == 0
    assert batcher.executing_count == 0


# --- batching ----------------------------------------------------------------------


async def test_batches_grow_while_the_only_instance_is_busy():
    engine = RecordingEngine(hold=True)
    async with serving(engine, BatchPolicy(max_batch_size=8)) as batcher:
        first = submit(batcher, rows(1))
        await engine.wait_calls(1)
        later = [submit(batcher, rows(i)) for i in (2, 3, 4, 5)]
        await settle()
        assert (batcher.pending_count, batcher.executing_count) == (4, 1)
        assert len(engine.calls) == 1
        engine.release()
        results = await finish(first, *later)
    assert engine.batches == [[1], [2, 3, 4, 5]]
    for request, result in zip((1, 2, 3, 4, 5), results, strict=True):
        assert_own_rows(result, request)
    assert [r.batch_size for r in results] == [1, 4, 4, 4, 4]


async def test_a_batch_never_exceeds_max_batch_size():
    engine = RecordingEngine(hold=True)
    async with serving(engine, BatchPolicy(max_batch_size=4)) as batcher:
        tasks = [submit(batcher, rows(0))]
        await engine.wait_calls(1)
        tasks += [submit(batcher, rows(i, count)) for i, count in ((1, 2), (2, 1), (3, 2), (4, 4))]
        await settle()
        engine.release()
        results = await finish(*tasks)
    assert engine.batches == [[0], [1, 2], [3], [4]]
    assert_own_rows(results[4], 4, count=4)


@pytest.mark.parametrize(
    ("preferred", "queued", "expected"),
    [
        pytest.param((2, 4), [1, 1, 1, 1, 1], [[1, 2, 3, 4], [5]], id="largest-preferred-reached"),
        pytest.param((2, 4), [1, 1, 1], [[1, 2], [3]], id="best-preferred-below-what-is-there"),
        pytest.param((4,), [3, 2, 1], [[1], [2, 3]], id="stops-before-passing-largest-preferred"),
        pytest.param((), [3, 2, 1, 2, 2], [[1, 2, 3], [4, 5]], id="default-is-max-batch-size"),
    ],
)
async def test_preferred_batch_sizes(preferred, queued, expected):
    engine = RecordingEngine(hold=True)
    policy = BatchPolicy(max_batch_size=6, preferred_batch_sizes=preferred)
    async with serving(engine, policy) as batcher:
        tasks = [submit(batcher, rows(0))]
        await engine.wait_calls(1)
        tasks += [submit(batcher, rows(i, n)) for i, n in enumerate(queued, start=1)]
        await settle()
        engine.release()
        results = await finish(*tasks)
    assert engine.batches == [[0], *expected]
    for request, count in enumerate(queued, start=1):
        assert_own_rows(results[request], request, count)


async def test_max_queue_delay_waits_for_a_fuller_batch():
    clock = FakeClock()
    engine = RecordingEngine()
    policy = BatchPolicy(
        max_batch_size=8, preferred_batch_sizes=(4,), max_queue_delay_us=10 * SECOND_US
    )
    async with serving(engine, policy, clock=clock.ns) as batcher:
        tasks = [submit(batcher, rows(1))]
        await settle()
        tasks += [submit(batcher, rows(2)), submit(batcher, rows(3))]
        await settle()
        assert engine.calls == []
        assert batcher.pending_count == 3
        tasks.append(submit(batcher, rows(4)))
        await finish(*tasks)
        assert engine.batches == [[1, 2, 3, 4]]

        late = [submit(batcher, rows(5))]
        await settle()
        clock.advance(11)
        late.append(submit(batcher, rows(6)))
        await finish(*late)
    assert engine.batches == [[1, 2, 3, 4], [5, 6]]


async def test_max_queue_delay_runs_out_on_its_own():
    engine = RecordingEngine()
    policy = BatchPolicy(max_batch_size=8, preferred_batch_sizes=(4,), max_queue_delay_us=20_000)
    async with serving(engine, policy) as batcher:
        (result,) = await finish(submit(batcher, rows(1)))
    assert result.batch_size == 1
    assert engine.batches == [[1]]


@pytest.mark.parametrize(
    ("advance_s", "expected"),
    [
        pytest.param(0, [[1, 2], [3, 4], [5, 6], [7]], id="within-delay-preferred-size-first"),
        pytest.param(11, [[1, 2], [3, 4, 5, 6], [7]], id="delay-exceeded-sends-up-to-max"),
    ],
)
async def test_exceeded_delay_overrides_preferred_size(advance_s, expected):
    clock = FakeClock()
    engine = RecordingEngine(hold=True)
    policy = BatchPolicy(
        max_batch_size=4, preferred_batch_sizes=(2,), max_queue_delay_us=10 * SECOND_US
    )
    async with serving(engine, policy, clock=clock.ns) as batcher:
        tasks = [submit(batcher, rows(1)), submit(batcher, rows(2))]
        await engine.wait_calls(1)
        tasks += [submit(batcher, rows(i)) for i in (3, 4, 5, 6, 7)]
        await settle()
        clock.advance(advance_s)
        engine.release()
        await engine.wait_calls(len(expected) - 1)
        await settle()
        # Within the delay the last request waits (10 s) for company; close sends it.
        closing = asyncio.create_task(batcher.close(timeout_s=5))
        await finish(*tasks)
        await closing
    assert engine.batches == expected


async def test_instances_each_take_the_next_batch():
    engine = RecordingEngine(hold=True)
    async with serving(engine, BatchPolicy(max_batch_size=8, instance_count=2)) as batcher:
        tasks = [submit(batcher, rows(1))]
        await engine.wait_calls(1)
        tasks.append(submit(batcher, rows(2)))
        await engine.wait_calls(2)
        tasks += [submit(batcher, rows(3)), submit(batcher, rows(4))]
        await settle()
        assert (engine.running, batcher.executing_count, batcher.pending_count) == (2, 2, 2)
        engine.release()
        await finish(*tasks)
    assert engine.max_running == 2
    assert engine.batches == [[1], [2], [3, 4]]


async def test_requests_of_other_shapes_or_inputs_end_the_batch():
    engine = RecordingEngine(hold=True)
    async with serving(engine, BatchPolicy(max_batch_size=8)) as batcher:
        tasks = [submit(batcher, rows(0))]
        await engine.wait_calls(1)
        tasks += [
            submit(batcher, rows(1, width=2)),
            submit(batcher, rows(2, width=2)),
            submit(batcher, rows(3, width=3)),
            submit(batcher, rows(4, width=2)),
            submit(batcher, {**rows(5), "z": np.zeros((1, 2))}),
            submit(batcher, {**rows(6), "z": np.zeros((1, 2))}),
        ]
        await settle()
        engine.release()
        results = await finish(*tasks)
    assert engine.batches == [[0], [1, 2], [3], [4], [5, 6]]
    assert_own_rows(results[3], 3, width=3)


async def test_bytes_tensors_are_batched_and_split():
    engine = RecordingEngine(hold=True)
    policy = BatchPolicy(max_batch_size=8)
    async with serving(engine, policy) as batcher:
        engine.outputs = lambda batch: {"y": batch["s"]}
        first = submit(batcher, {"s": np.array([[b"x"]], dtype=object)})
        await engine.wait_calls(1)
        a = submit(batcher, {"s": np.array([[b"a"], [b"b"]], dtype=object)})
        b = submit(batcher, {"s": np.array([[b"c"]], dtype=object)})
        await settle()
        engine.release()
        _, got_a, got_b = await finish(first, a, b)
    assert got_a.outputs["y"].tolist() == [[b"a"], [b"b"]]
    assert got_b.outputs["y"].tolist() == [[b"c"]]
    assert got_a.batch_size == got_b.batch_size == 3


async def test_request_larger_than_max_batch_size_is_refused():
    async with serving(RecordingEngine(), BatchPolicy(max_batch_size=4)) as batcher:
        with pytest.raises(InvalidArgumentError) as caught:
            await batcher.submit(rows(1, 5), request_id="big")
    assert str(caught.value) == "[request id: big] inference request batch-size must be <= 4"


async def test_request_without_inputs_counts_as_one_row():
    engine = RecordingEngine()
    engine.outputs = lambda batch: {}
    async with serving(engine, BatchPolicy(max_batch_size=8)) as batcher:
        result = await batcher.submit({})
    assert (result.outputs, result.batch_size) == ({}, 1)
    assert engine.calls == [{}]


# --- batching off ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "policy",
    [
        pytest.param(BatchPolicy(max_batch_size=0), id="max-batch-size-0"),
        pytest.param(
            BatchPolicy.from_config(ModelConfig(max_batch_size=8)), id="no-dynamic-batching"
        ),
    ],
)
async def test_batching_off_runs_each_request_alone_and_untouched(policy):
    engine = RecordingEngine(hold=True)
    async with serving(engine, policy) as batcher:
        inputs = [{"x": np.full((3,), float(i))} for i in range(3)]
        tasks = [submit(batcher, inputs[0])]
        await engine.wait_calls(1)
        tasks += [submit(batcher, inputs[1]), submit(batcher, inputs[2])]
        await settle()
        assert batcher.pending_count == 2
        engine.release()
        results = await finish(*tasks)
    assert [call["x"] is given["x"] for call, given in zip(engine.calls, inputs, strict=True)] == [
        True
    ] * 3
    for i, result in enumerate(results):
        np.testing.assert_array_equal(result.outputs["y"], np.full((3,), 2.0 * i + 1))
        assert result.batch_size == 1


# --- priorities and queue policies --------------------------------------------------


async def test_priority_levels_are_strict_and_fifo_within_a_level():
    engine = RecordingEngine(hold=True)
    policy = BatchPolicy(max_batch_size=1, priority_levels=3, default_priority_level=2)
    async with serving(engine, policy) as batcher:
        tasks = [submit(batcher, rows(0), priority=1)]
        await engine.wait_calls(1)
        # priority 0 and priorities above the levels go to the default level (2)
        for request, priority in ((1, 3), (2, 0), (3, 1), (4, 7), (5, 2), (6, 1)):
            tasks.append(submit(batcher, rows(request), priority=priority))
        await settle()
        engine.release()
        await finish(*tasks)
    assert engine.batches == [[0], [3], [6], [2], [4], [5], [1]]


async def test_one_batch_walks_levels_in_order():
    engine = RecordingEngine(hold=True)
    policy = BatchPolicy(max_batch_size=8, priority_levels=2, default_priority_level=2)
    async with serving(engine, policy) as batcher:
        tasks = [submit(batcher, rows(0))]
        await engine.wait_calls(1)
        for request, priority in ((1, 2), (2, 1), (3, 2), (4, 1)):
            tasks.append(submit(batcher, rows(request), priority=priority))
        await settle()
        engine.release()
        results = await finish(*tasks)
    assert engine.batches == [[0], [2, 4, 1, 3]]
    for request in (1, 2, 3, 4):
        assert_own_rows(results[request], request)


async def test_max_queue_size_is_per_level_with_tritons_text():
    engine = RecordingEngine(hold=True)
    policy = BatchPolicy(
        max_batch_size=8,
        priority_levels=2,
        default_priority_level=1,
        priority_queue_policies={2: QueuePolicy(max_queue_size=2)},
    )
    async with serving(engine, policy) as batcher:
        tasks = [submit(batcher, rows(0))]
        await engine.wait_calls(1)
        tasks += [submit(batcher, rows(i), priority=2) for i in (1, 2)]
        await settle()
        with pytest.raises(QueueFullError) as caught:
            await batcher.submit(rows(3), priority=2, request_id="r3")
        assert str(caught.value) == "[request id: r3] Exceeds maximum queue size"
        tasks += [submit(batcher, rows(i), priority=1) for i in (4, 5, 6)]
        await settle()
        assert batcher.pending_count == 5
        engine.release()
        await finish(*tasks)
    assert engine.batches == [[0], [4, 5, 6, 1, 2]]


async def test_queue_bound_holds_whatever_the_config_says():
    engine = RecordingEngine(hold=True)
    policy = BatchPolicy(
        max_batch_size=8,
        queue_bound=2,
        # a policy for a level that does not exist (priority_levels 0) is not read
        priority_queue_policies={1: QueuePolicy(max_queue_size=1)},
    )
    async with serving(engine, policy) as batcher:
        tasks = [submit(batcher, rows(0))]
        await engine.wait_calls(1)
        tasks += [submit(batcher, rows(1)), submit(batcher, rows(2))]
        await settle()
        with pytest.raises(QueueFullError, match=r"^\[request id: <id_unknown>\] Exceeds"):
            await batcher.submit(rows(3))
        engine.release()
        await finish(*tasks)
    assert engine.batches == [[0], [1, 2]]


async def test_expired_reject_requests_fail_and_executing_ones_never_time_out():
    clock = FakeClock()
    engine = RecordingEngine(hold=True)
    policy = BatchPolicy(
        max_batch_size=8, default_queue_policy=QueuePolicy(default_timeout_us=SECOND_US)
    )
    async with serving(engine, policy, clock=clock.ns) as batcher:
        executing = submit(batcher, rows(0))
        await engine.wait_calls(1)
        expired = submit(batcher, rows(1), request_id="a")
        await settle()
        clock.advance(2)
        fresh = submit(batcher, rows(2))
        await settle()
        engine.release()
        with pytest.raises(RequestTimeoutError) as caught:
            await expired
        results = await finish(executing, fresh)
    assert str(caught.value) == "[request id: a] Request timeout expired"
    assert engine.batches == [[0], [2]]
    assert_own_rows(results[0], 0)
    assert batcher.pending_count == 0


async def test_expired_delay_requests_move_behind_the_unexpired_ones():
    clock = FakeClock()
    engine = RecordingEngine(hold=True)
    policy = BatchPolicy(
        max_batch_size=8,
        default_queue_policy=QueuePolicy(timeout_action="DELAY", default_timeout_us=SECOND_US),
    )
    async with serving(engine, policy, clock=clock.ns) as batcher:
        tasks = [submit(batcher, rows(0))]
        await engine.wait_calls(1)
        tasks += [submit(batcher, rows(1)), submit(batcher, rows(2))]
        await settle()
        clock.advance(2)
        tasks += [submit(batcher, rows(3)), submit(batcher, rows(4))]
        await settle()
        engine.release()
        results = await finish(*tasks)
    assert engine.batches == [[0], [3, 4, 1, 2]]
    for request in range(5):
        assert_own_rows(results[request], request)


async def test_delayed_requests_still_batch_behind_the_unexpired_ones():
    clock = FakeClock()
    engine = RecordingEngine(hold=True)
    policy = BatchPolicy(
        max_batch_size=8,
        preferred_batch_sizes=(3,),
        max_queue_delay_us=60 * SECOND_US,
        default_queue_policy=QueuePolicy(timeout_action="DELAY", default_timeout_us=SECOND_US),
    )
    async with serving(engine, policy, clock=clock.ns) as batcher:
        tasks = [submit(batcher, rows(i)) for i in (0, 1, 2)]
        await engine.wait_calls(1)
        tasks.append(submit(batcher, rows(3)))
        await settle()
        clock.advance(2)
        engine.release()
        await settle()
        # request 3 was moved to the back of an empty level: it waits for company
        assert batcher.pending_count == 1
        tasks += [submit(batcher, rows(4)), submit(batcher, rows(5))]
        await finish(*tasks)
    assert engine.batches == [[0, 1, 2], [4, 5, 3]]


@pytest.mark.parametrize(
    ("default_us", "allow", "request_us", "advance_us", "is_rejected"),
    [
        pytest.param(SECOND_US, True, 500_000, 750_000, True, id="shorter-override-counts"),
        pytest.param(SECOND_US, True, 2 * SECOND_US, 1_500_000, True, id="longer-override-ignored"),
        pytest.param(SECOND_US, False, 500_000, 750_000, False, id="override-not-allowed"),
        pytest.param(0, True, 500_000, 750_000, False, id="no-default-no-timeout"),
        pytest.param(SECOND_US, True, 0, 750_000, False, id="zero-request-keeps-default"),
        pytest.param(SECOND_US, True, 0, 1_000_000, True, id="deadline-is-inclusive"),
    ],
)
async def test_timeout_override_rules(default_us, allow, request_us, advance_us, is_rejected):
    clock = FakeClock()
    engine = RecordingEngine(hold=True)
    policy = BatchPolicy(
        max_batch_size=8,
        default_queue_policy=QueuePolicy(
            default_timeout_us=default_us, allow_timeout_override=allow
        ),
    )
    async with serving(engine, policy, clock=clock.ns) as batcher:
        tasks = [submit(batcher, rows(0))]
        await engine.wait_calls(1)
        waiting = submit(batcher, rows(1), timeout_us=request_us)
        await settle()
        clock.advance(ms=advance_us / 1000)
        engine.release()
        await finish(*tasks)
        if is_rejected:
            with pytest.raises(RequestTimeoutError):
                await waiting
        else:
            await finish(waiting)


async def test_reject_timeout_fires_while_every_instance_is_busy():
    engine = RecordingEngine(hold=True)
    policy = BatchPolicy(
        max_batch_size=8, default_queue_policy=QueuePolicy(default_timeout_us=20_000)
    )
    async with serving(engine, policy) as batcher:
        busy = submit(batcher, rows(0))
        await engine.wait_calls(1)
        with pytest.raises(RequestTimeoutError):
            async with asyncio.timeout(5):
                await batcher.submit(rows(1))
        assert (engine.running, batcher.pending_count) == (1, 0)
        engine.release()
        await finish(busy)


async def test_reject_timer_trusts_the_injected_clock():
    clock = FakeClock()
    engine = RecordingEngine(hold=True)
    policy = BatchPolicy(
        max_batch_size=8, default_queue_policy=QueuePolicy(default_timeout_us=20_000)
    )
    async with serving(engine, policy, clock=clock.ns) as batcher:
        busy = submit(batcher, rows(0))
        await engine.wait_calls(1)
        waiting = submit(batcher, rows(1))
        await asyncio.sleep(0.1)  # the loop timer fired (more than once); the clock says no
        assert not waiting.done()
        clock.advance(1)
        with pytest.raises(RequestTimeoutError):
            async with asyncio.timeout(5):
                await waiting
        assert batcher.pending_count == 0
        engine.release()
        await finish(busy)


@pytest.mark.parametrize(
    ("delay_us", "timeout_us", "is_rejected"),
    [
        pytest.param(60 * SECOND_US, 20_000, True, id="deadline-before-delay-ends"),
        pytest.param(20_000, 60 * SECOND_US, False, id="delay-ends-before-deadline"),
    ],
)
async def test_waiting_for_a_fuller_batch_respects_deadlines(delay_us, timeout_us, is_rejected):
    policy = BatchPolicy(
        max_batch_size=8,
        preferred_batch_sizes=(4,),
        max_queue_delay_us=delay_us,
        default_queue_policy=QueuePolicy(default_timeout_us=timeout_us),
    )
    async with serving(RecordingEngine(), policy) as batcher:
        task = submit(batcher, rows(1))
        if is_rejected:
            with pytest.raises(RequestTimeoutError):
                await finish(task)
        else:
            (result,) = await finish(task)
            assert result.batch_size == 1


# --- failures ----------------------------------------------------------------------


async def test_engine_exception_fails_every_request_of_the_execution():
    engine = RecordingEngine(hold=True)
    seen: list[tuple[int, int]] = []
    policy = BatchPolicy(max_batch_size=8)
    async with serving(engine, policy, on_execution=lambda *a: seen.append(a)) as batcher:
        tasks = [submit(batcher, rows(0))]
        await engine.wait_calls(1)
        failing = [submit(batcher, rows(1)), submit(batcher, rows(2))]
        await settle()
        boom = RuntimeError("CUDA error: out of memory")
        engine.errors = [ValueError(""), boom]  # one per execution: [0], then [1, 2]
        engine.release()
        outcomes = await asyncio.gather(*tasks, *failing, return_exceptions=True)
        after = await finish(submit(batcher, rows(3)))
    assert isinstance(outcomes[0], InternalError)
    assert str(outcomes[0]) == "ValueError"
    assert [type(o) for o in outcomes[1:]] == [InternalError, InternalError]
    error = outcomes[1]
    assert error is outcomes[2]
    assert isinstance(error, InternalError)
    assert str(error) == "CUDA error: out of memory"
    assert error.__cause__ is boom
    assert_own_rows(after[0], 3)
    assert [batch_size for batch_size, _ in seen] == [1]  # failed executions are not counted


async def test_zeroserve_errors_from_the_engine_pass_through():
    engine = RecordingEngine()
    error = ModelNotReadyError("model is unloading")
    engine.errors = [error]
    async with serving(engine, BatchPolicy(max_batch_size=8)) as batcher:
        with pytest.raises(ModelNotReadyError) as caught:
            await batcher.submit(rows(1))
    assert caught.value is error


async def test_engine_cancelling_itself_is_an_internal_error():
    engine = RecordingEngine()
    engine.errors = [asyncio.CancelledError()]
    async with serving(engine, BatchPolicy(max_batch_size=8)) as batcher:
        with pytest.raises(InternalError, match="the engine cancelled the execution"):
            await batcher.submit(rows(1))
        assert_own_rows(await batcher.submit(rows(2)), 2)


@pytest.mark.parametrize(
    "outputs",
    [
        pytest.param(lambda batch: {"y": batch["x"][:1]}, id="fewer-rows"),
        pytest.param(lambda batch: {"y": np.float32(1.0) + np.zeros(())}, id="scalar"),
    ],
)
async def test_outputs_of_the_wrong_batch_size_fail_the_batch(outputs):
    engine = RecordingEngine()
    engine.outputs = outputs
    async with serving(engine, BatchPolicy(max_batch_size=8)) as batcher:
        tasks = [submit(batcher, rows(1)), submit(batcher, rows(2, 2))]
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    assert [type(o) for o in outcomes] == [InternalError] * 2
    assert outcomes[0] is outcomes[1]
    assert "for a batch of 3 rows" in str(outcomes[0])


async def test_on_execution_reports_each_execution_and_results_carry_timings():
    clock = FakeClock()
    engine = RecordingEngine(hold=True, clock=clock)
    engine.compute_ms = 5
    seen: list[tuple[int, int]] = []
    async with serving(
        engine,
        BatchPolicy(max_batch_size=8),
        clock=clock.ns,
        on_execution=lambda *a: seen.append(a),
    ) as batcher:
        first = submit(batcher, rows(0))
        await engine.wait_calls(1)
        tasks = [submit(batcher, rows(1)), submit(batcher, rows(2, 2))]
        await settle()
        clock.advance(ms=2)
        engine.release()
        results = await finish(first, *tasks)
    ms = 1_000_000
    assert seen == [(1, 7 * ms), (3, 5 * ms)]
    assert [(r.queue_ns, r.compute_ns, r.batch_size) for r in results] == [
        (0, 7 * ms, 1),
        (2 * ms, 5 * ms, 3),
        (2 * ms, 5 * ms, 3),
    ]


async def test_a_failing_on_execution_callback_is_logged_and_serving_goes_on(caplog):
    def broken(batch_size: int, compute_ns: int) -> None:
        raise RuntimeError("metrics down")

    engine = RecordingEngine()
    async with serving(engine, BatchPolicy(max_batch_size=8), on_execution=broken) as batcher:
        with caplog.at_level(logging.ERROR, logger="data_plane.batcher"):
            assert_own_rows(await batcher.submit(rows(1)), 1)
            assert_own_rows(await batcher.submit(rows(2)), 2)
    assert [r.getMessage() for r in caplog.records] == ["on_execution callback failed"] * 2


# --- cancellation ------------------------------------------------------------------


async def test_cancelled_queued_request_leaves_the_queue():
    engine = RecordingEngine(hold=True)
    async with serving(engine, BatchPolicy(max_batch_size=8)) as batcher:
        tasks = [submit(batcher, rows(0))]
        await engine.wait_calls(1)
        gone = submit(batcher, rows(1))
        tasks.append(submit(batcher, rows(2)))
        await settle()
        gone.cancel()
        await settle()
        assert batcher.pending_count == 1
        engine.release()
        await finish(*tasks)
    assert gone.cancelled()
    assert engine.batches == [[0], [2]]


async def test_request_cancelled_as_the_batch_forms_is_left_out():
    engine = RecordingEngine(hold=True)
    async with serving(engine, BatchPolicy(max_batch_size=8)) as batcher:
        tasks = [submit(batcher, rows(0))]
        await engine.wait_calls(1)
        gone = submit(batcher, rows(1))
        tasks.append(submit(batcher, rows(2)))
        await settle()
        # The instance resumes (and walks the queue) before the cancelled caller does.
        engine.release()
        gone.cancel()
        await finish(*tasks)
        assert (batcher.pending_count, batcher.executing_count) == (0, 0)
    assert engine.batches == [[0], [2]]


@pytest.mark.parametrize("is_failing", [False, True], ids=["result", "error"])
async def test_cancelled_executing_request_drops_its_outcome_only(is_failing):
    engine = RecordingEngine(hold=True)
    if is_failing:
        engine.errors = [RuntimeError("boom")]
    async with serving(engine, BatchPolicy(max_batch_size=8)) as batcher:
        gone, kept = submit(batcher, rows(1)), submit(batcher, rows(2))
        await engine.wait_calls(1)
        gone.cancel()
        await settle()
        assert batcher.executing_count == 2
        engine.release()
        (outcome,) = await asyncio.gather(kept, return_exceptions=True)
    assert gone.cancelled()
    assert engine.batches == [[1, 2]]
    if is_failing:
        assert isinstance(outcome, InternalError)
    else:
        assert isinstance(outcome, BatchedResult)
        assert outcome.batch_size == 2
        assert_own_rows(outcome, 2)


async def test_mass_cancellation_keeps_the_queue_consistent():
    engine = RecordingEngine(hold=True)
    async with serving(engine, BatchPolicy(max_batch_size=8)) as batcher:
        tasks = [submit(batcher, rows(0))]
        await engine.wait_calls(1)
        queued = [submit(batcher, rows(i)) for i in range(1, 101)]
        await settle()
        kept = [queued[10], queued[90]]
        for task in queued:
            if task not in kept:
                task.cancel()
        await settle()
        assert batcher.pending_count == 2
        engine.release()
        results = await finish(*tasks, *kept)
    assert engine.batches == [[0], [11, 91]]
    assert_own_rows(results[2], 91)


# --- lifecycle ----------------------------------------------------------------------


async def test_close_drains_queued_and_executing_then_refuses():
    engine = RecordingEngine(hold=True)
    batcher = Batcher(engine, BatchPolicy(max_batch_size=8, instance_count=2))
    await batcher.start()
    await batcher.start()
    assert len(batcher_tasks()) == 2
    tasks = [submit(batcher, rows(0))]
    await engine.wait_calls(1)
    tasks.append(submit(batcher, rows(1)))
    await engine.wait_calls(2)
    tasks.append(submit(batcher, rows(2)))
    await settle()
    # A long drain timeout: close must return because the work is done, not because time is up.
    closing = asyncio.create_task(batcher.close(timeout_s=600))
    await settle()
    with pytest.raises(ServerStoppingError, match="^Server is stopping"):
        await batcher.submit(rows(3))
    engine.release()
    results = await finish(*tasks)
    async with asyncio.timeout(5):
        await closing
    for request, result in enumerate(results):
        assert_own_rows(result, request)
    assert batcher_tasks() == []
    await batcher.close(timeout_s=0.01)


async def test_close_fails_what_did_not_finish_in_time(caplog):
    engine = RecordingEngine(hold=True)
    batcher = Batcher(engine, BatchPolicy(max_batch_size=1))
    await batcher.start()
    executing = submit(batcher, rows(0))
    await engine.wait_calls(1)
    queued = submit(batcher, rows(1))
    await settle()
    with caplog.at_level(logging.WARNING, logger="data_plane.batcher"):
        await batcher.close(timeout_s=0.05)
    for task in (executing, queued):
        with pytest.raises(ServerStoppingError):
            await task
    assert (batcher.pending_count, batcher.executing_count) == (0, 0)
    assert batcher_tasks() == []
    assert "drain timed out" in caplog.text


async def test_close_returns_once_the_last_queued_request_is_cancelled():
    engine = RecordingEngine(hold=True)
    batcher = Batcher(engine, BatchPolicy(max_batch_size=1))
    await batcher.start()
    executing = submit(batcher, rows(0))
    await engine.wait_calls(1)
    gone = submit(batcher, rows(1))
    await settle()
    closing = asyncio.create_task(batcher.close(timeout_s=600))
    await settle()
    # The instance comes back and drops the cancelled request before its caller runs.
    engine.release()
    gone.cancel()
    await finish(executing)
    async with asyncio.timeout(5):
        await closing
    assert gone.cancelled()
    assert engine.batches == [[0]]


async def test_a_second_close_waits_for_the_first():
    engine = RecordingEngine(hold=True)
    batcher = Batcher(engine, BatchPolicy(max_batch_size=8))
    await batcher.start()
    busy = submit(batcher, rows(0))
    await engine.wait_calls(1)
    first = asyncio.create_task(batcher.close(timeout_s=5))
    await settle()
    await batcher.close(timeout_s=0.01)  # gives up waiting; the first is still draining
    assert not first.done()
    engine.release()
    second = asyncio.create_task(batcher.close(timeout_s=5))
    await finish(busy)
    async with asyncio.timeout(5):
        await asyncio.gather(first, second)


async def test_close_before_start_fails_the_queue_and_start_after_close_does_nothing():
    batcher = Batcher(RecordingEngine(), BatchPolicy(max_batch_size=8))
    queued = submit(batcher, rows(1))
    await settle()
    await batcher.close(timeout_s=5)
    with pytest.raises(ServerStoppingError):
        await queued
    await batcher.start()
    assert batcher_tasks() == []


async def test_close_gives_up_on_an_engine_that_ignores_cancellation(caplog):
    release = asyncio.Event()

    async def stubborn(batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await release.wait()
        return {"y": batch["x"]}

    batcher = Batcher(stubborn, BatchPolicy(max_batch_size=8))
    await batcher.start()
    executing = submit(batcher, rows(0))
    await settle()
    with caplog.at_level(logging.ERROR, logger="data_plane.batcher"):
        await batcher.close(timeout_s=0.05)
    with pytest.raises(ServerStoppingError):
        await executing
    assert "ignores cancellation" in caplog.text
    assert len(batcher_tasks()) == 1
    release.set()
    await settle()
    assert batcher_tasks() == []


# --- policy -------------------------------------------------------------------------


def _config(text: str) -> ModelConfig:
    return text_format.Parse(text, ModelConfig())


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        pytest.param(
            "max_batch_size: 8 instance_group [{ count: 2 }]",
            BatchPolicy(instance_count=2),
            id="default-scheduler-batching-off",
        ),
        pytest.param(
            "max_batch_size: 8 dynamic_batching {}",
            BatchPolicy(max_batch_size=8, preferred_batch_sizes=(8,)),
            id="empty-dynamic-batching",
        ),
        pytest.param(
            "max_batch_size: 0 instance_group [{ count: 0 }] dynamic_batching "
            "{ priority_levels: 2 default_priority_level: 2 }",
            BatchPolicy(priority_levels=2, default_priority_level=2),
            id="batching-off-keeps-priorities",
        ),
        pytest.param(
            """
            max_batch_size: 8
            instance_group [{ count: 2 }, { count: 1 }]
            dynamic_batching {
              preferred_batch_size: [ 8, 4, 4 ]
              max_queue_delay_microseconds: 100
              priority_levels: 2
              default_priority_level: 1
              default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 500 }
              priority_queue_policy {
                key: 2 value: { max_queue_size: 3 allow_timeout_override: true }
              }
            }
            """,
            BatchPolicy(
                max_batch_size=8,
                preferred_batch_sizes=(4, 8),
                max_queue_delay_us=100,
                priority_levels=2,
                default_priority_level=1,
                default_queue_policy=QueuePolicy(timeout_action="DELAY", default_timeout_us=500),
                priority_queue_policies={
                    2: QueuePolicy(max_queue_size=3, allow_timeout_override=True)
                },
                instance_count=3,
            ),
            id="everything",
        ),
    ],
)
def test_from_config(config, expected):
    assert BatchPolicy.from_config(_config(config)) == expected


def test_from_config_passes_the_queue_bound():
    policy = BatchPolicy.from_config(ModelConfig(), queue_bound=7)
    assert (policy.queue_bound, policy.instance_count, policy.max_batch_size) == (7, 1, 0)
    assert policy.default_queue_policy == QueuePolicy()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"max_batch_size": -1}, "must be non-negative", id="negative-max"),
        pytest.param(
            {"max_batch_size": 4, "preferred_batch_sizes": (0,)}, "must be positive", id="zero"
        ),
        pytest.param(
            {"max_batch_size": 4, "preferred_batch_sizes": (8,)},
            "must be <= max batch size",
            id="above-max",
        ),
        pytest.param(
            {"priority_levels": 2},
            r"default priority level must be in range \[1, 2\]",
            id="default-level-0",
        ),
        pytest.param(
            {
                "priority_levels": 2,
                "default_priority_level": 1,
                "priority_queue_policies": {3: QueuePolicy()},
            },
            r"priority queue policy must have priority level in range \[1, 2\]",
            id="policy-level-out-of-range",
        ),
        pytest.param({"instance_count": 0}, "instance_count", id="no-instances"),
        pytest.param({"queue_bound": 0}, "queue_bound", id="no-queue"),
    ],
)
def test_invalid_policies_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BatchPolicy(**kwargs)
