"""ResponseStream: closing it after the final response lets the execution end on its own
(an answered request is a success, not a cancellation); closing it before cancels."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from data_plane.response_stream import ResponseStream
from runtimes.model_request import RequestContext, StreamedResponse

pytestmark = pytest.mark.anyio


class _Execution:
    """A decoupled execution that sends its responses, then keeps running until told
    (as a model's ``execute`` returns after its sender's final flag)."""

    def __init__(self, responses: int) -> None:
        self.responses = responses
        self.release = asyncio.Event()
        self.outcome = "running"
        self.saw_cancelled = False

    async def __call__(self, context: RequestContext) -> None:
        sink = context.responses
        assert sink is not None
        try:
            for index in range(self.responses):
                sink(StreamedResponse({"OUT": np.array([index])}), lambda: None)
            sink(StreamedResponse({}, None, True), lambda: None)
            await self.release.wait()
            self.saw_cancelled = context.is_cancelled()
            self.outcome = "ended"
        except asyncio.CancelledError:
            self.outcome = "cancelled"
            raise


def _stream(execution: _Execution) -> ResponseStream:
    return ResponseStream("m", RequestContext(), execution, lambda produced: [])


async def test_closing_after_the_final_response_lets_the_execution_end() -> None:
    execution = _Execution(2)
    stream = _stream(execution)
    finals = [answer.is_final async for answer in stream]
    assert finals == [False, False, True]
    closing = asyncio.create_task(stream.aclose())
    await asyncio.sleep(0)
    assert not closing.done()
    execution.release.set()
    await closing
    assert execution.outcome == "ended"
    assert execution.saw_cancelled is False


async def test_closing_before_the_final_response_cancels() -> None:
    execution = _Execution(2)
    stream = _stream(execution)
    first = await stream.__anext__()
    assert first.is_final is False
    await stream.aclose()
    assert execution.outcome == "cancelled"
    assert stream.is_cancelled()


async def test_an_execution_that_never_ends_is_cancelled_after_the_idle_timeout() -> None:
    execution = _Execution(0)
    stream = ResponseStream("m", RequestContext(), execution, lambda p: [], idle_timeout_s=0.05)
    assert [answer.is_final async for answer in stream] == [True]
    await stream.aclose()
    assert execution.outcome == "cancelled"
