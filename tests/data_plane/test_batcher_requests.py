"""The batcher with ``execute_requests``: batches reach the engine as their separate
requests (no rows merged), each with its context, and each request gets its own outcome.
Driven through ``submit()`` against a recording engine; assertions are about composition,
never durations."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
import pytest

from data_plane.batcher import Batcher, BatchPolicy
from data_plane.errors import InternalError, InvalidArgumentError, ServerStoppingError
from foundation.proto.model_config_pb2 import ModelConfig
from runtimes.model_request import ModelRequest, RequestContext, RequestOutcome

pytestmark = pytest.mark.anyio


class RequestEngine:
    """Doubles each request's rows; a request whose id starts with "bad" gets an error;
    holds executions until released so that requests pile up into one batch."""

    def __init__(self) -> None:
        self.calls: list[list[ModelRequest]] = []
        self.gate = asyncio.Event()
        self.fail_whole = False
        self.cancelled_seen: list[bool] = []
        self._called = asyncio.Event()

    async def wait_calls(self, count: int) -> None:
        async with asyncio.timeout(5):
            while len(self.calls) < count:
                self._called.clear()
                await self._called.wait()

    async def __call__(self, requests: Sequence[ModelRequest]) -> list[RequestOutcome]:
        self.calls.append(list(requests))
        self._called.set()
        async with asyncio.timeout(5):
            await self.gate.wait()
        if self.fail_whole:
            raise InternalError("the whole execution failed")
        self.cancelled_seen = [r.context.is_cancelled() for r in requests]
        return [
            InvalidArgumentError(f"bad request {r.context.request_id}")
            if r.context.request_id.startswith("bad")
            else {"y": r.inputs["x"] * 2}
            for r in requests
        ]


def _engine_unused(batch: object) -> object:
    raise AssertionError("execute must not run when execute_requests is given")


def _batcher(engine: RequestEngine, *, max_batch_size: int = 8) -> Batcher:
    config = ModelConfig(max_batch_size=max_batch_size)
    config.dynamic_batching.SetInParent()
    config.instance_group.add(count=1)
    policy = BatchPolicy.from_config(config, queue_bound=64)
    return Batcher(_engine_unused, policy, execute_requests=engine)  # type: ignore[arg-type]


def _x(value: float, rows: int = 1) -> dict[str, np.ndarray]:
    return {"x": np.full((rows, 2), value, dtype=np.float32)}


async def _submit_all(batcher: Batcher, engine: RequestEngine, ids: list[str]):
    first = asyncio.create_task(
        batcher.submit(_x(0), request_id="first", context=RequestContext(request_id="first"))
    )
    # The first request holds the only instance; the rest queue and form one batch.
    await engine.wait_calls(1)
    rest = [
        asyncio.create_task(
            batcher.submit(
                _x(i + 1, rows=i + 1),
                request_id=rid,
                context=RequestContext(request_id=rid, parameters={"n": i}),
            )
        )
        for i, rid in enumerate(ids)
    ]
    await asyncio.sleep(0)
    engine.gate.set()
    return first, rest


async def test_requests_arrive_separately_and_errors_stay_per_request():
    engine = RequestEngine()
    batcher = _batcher(engine)
    await batcher.start()
    try:
        first, rest = await _submit_all(batcher, engine, ["a", "bad-b", "c"])
        assert (await first).outputs["y"].tolist() == [[0, 0]]
        results = await asyncio.gather(*rest, return_exceptions=True)
    finally:
        await batcher.close(timeout_s=5)
    assert [len(call) for call in engine.calls] == [1, 3]
    second = engine.calls[1]
    assert [r.context.request_id for r in second] == ["a", "bad-b", "c"]
    assert [r.inputs["x"].shape[0] for r in second] == [1, 2, 3]  # rows not merged
    assert [r.context.parameters["n"] for r in second] == [0, 1, 2]
    a, bad, c = results
    assert not isinstance(a, BaseException) and a.outputs["y"].tolist() == [[2, 2]]
    assert isinstance(bad, InvalidArgumentError) and bad.message == "bad request bad-b"
    assert not isinstance(c, BaseException) and c.outputs["y"].shape == (3, 2)
    assert not isinstance(c, BaseException) and c.batch_size == 6


async def test_an_execution_error_fails_every_request_of_the_batch():
    engine = RequestEngine()
    engine.fail_whole = True
    batcher = _batcher(engine)
    await batcher.start()
    try:
        first, rest = await _submit_all(batcher, engine, ["a", "b"])
        results = await asyncio.gather(first, *rest, return_exceptions=True)
    finally:
        await batcher.close(timeout_s=5)
    assert all(
        isinstance(r, InternalError) and r.message == "the whole execution failed" for r in results
    )


async def test_a_wrong_number_of_outcomes_fails_the_batch():
    async def short(requests: Sequence[ModelRequest]) -> list[RequestOutcome]:
        return []

    config = ModelConfig(max_batch_size=0)
    config.instance_group.add(count=1)
    batcher = Batcher(
        _engine_unused,  # type: ignore[arg-type]
        BatchPolicy.from_config(config, queue_bound=8),
        execute_requests=short,
    )
    await batcher.start()
    try:
        with pytest.raises(InternalError, match="returned 0 outcomes for 1 requests"):
            await batcher.submit({"x": np.ones(2, np.float32)})
    finally:
        await batcher.close(timeout_s=5)


async def test_is_cancelled_tells_a_client_that_left():
    engine = RequestEngine()
    batcher = _batcher(engine)
    await batcher.start()
    try:
        first, rest = await _submit_all(batcher, engine, ["stays", "leaves"])
        engine.gate.clear()
        await first
        await engine.wait_calls(2)
        rest[1].cancel()
        await asyncio.sleep(0)
        engine.gate.set()
        await rest[0]
    finally:
        await batcher.close(timeout_s=5)
    assert engine.cancelled_seen == [False, True]


async def test_close_fails_queued_requests_as_before():
    engine = RequestEngine()
    batcher = _batcher(engine)
    await batcher.start()
    task = asyncio.create_task(batcher.submit(_x(1), context=RequestContext()))
    await engine.wait_calls(1)
    await batcher.close(timeout_s=0.1)
    with pytest.raises(ServerStoppingError):
        await task
