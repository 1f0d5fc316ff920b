"""A decoupled model's answer to one request: its responses as they come, the last final.

The request goes to the model's batcher like any other; its context carries this
stream's sink, which the runtime hands each response to, from the event loop. The
stream buffers at most ``max_buffered`` responses: past that, the runtime is told to
hold the next one (a stub's response sender waits), so a client that reads slowly slows
its model down instead of growing the server's memory. Each wait for the next response
is bounded by ``idle_timeout_s``. Closing the stream before its final response was read
(the client went away) makes the request read as cancelled to the model, withdraws it if
it is still queued, and lets the model's later responses through to nowhere. Closing it
after the final response lets the request's execution end on its own: the model has
answered, and its statistics count a success, not a cancellation.

Transport-free: the gRPC stream and HTTP's generate routes encode what it yields.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Final

import numpy as np

from data_plane.errors import InternalError, ZeroserveError
from data_plane.protocol import OutputTensor
from runtimes.model_request import RequestContext, StreamedResponse

logger = logging.getLogger(__name__)

MAX_BUFFERED: Final = 16
"""Responses a stream holds for its client before its model is made to wait."""
IDLE_TIMEOUT_S: Final = 600.0
"""The longest wait for a model's next response."""


@dataclass(frozen=True, slots=True)
class StreamedAnswer:
    """One response, ready for a transport: the outputs the request asked for (as
    produced), or the error it carries."""

    outputs: list[OutputTensor]
    error: ZeroserveError | None
    is_final: bool


Start = Callable[[RequestContext], Awaitable[None]]
"""Submits the request with the given context; returns when its execution ended, raises
when it failed (its error ends the stream)."""
Select = Callable[[Mapping[str, np.ndarray]], list[OutputTensor]]
"""The answer's tensors out of a response's outputs."""


class ResponseStream:
    """The responses of one request to a decoupled model; an async iterator, to be
    closed (:meth:`aclose`) when its reader stops early.

    Parameters:
        model: the model's name, for error texts.
        context: the request's context; the stream adds its sink and cancellation.
        start: submits the request (called once, at the first read).
        select: turns a response's outputs into the answer's tensors.
    """

    def __init__(
        self,
        model: str,
        context: RequestContext,
        start: Start,
        select: Select,
        *,
        max_buffered: int = MAX_BUFFERED,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
    ) -> None:
        self._model = model
        self._context = replace(context, responses=self._take, is_cancelled=self.is_cancelled)
        self._start = start
        self._select = select
        self._max_buffered = max_buffered
        self._idle_timeout_s = idle_timeout_s
        self._items: deque[tuple[StreamedResponse, Callable[[], None] | None]] = deque()
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._has_final = False
        self._has_read_final = False
        self._is_done = False
        self._is_cancelled = False

    def is_cancelled(self) -> bool:
        """Whether the reader went away (the model's ``is_cancelled``)."""
        return self._is_cancelled

    def __aiter__(self) -> ResponseStream:
        return self

    async def __anext__(self) -> StreamedAnswer:
        if self._is_done:
            raise StopAsyncIteration
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"stream-{self._model}")
        while not self._items:
            self._ready.clear()
            try:
                async with asyncio.timeout(self._idle_timeout_s):
                    await self._ready.wait()
            except TimeoutError:
                await self.aclose()
                return StreamedAnswer(
                    [],
                    InternalError(
                        f"model '{self._model}' sent no response within {self._idle_timeout_s} s"
                    ),
                    True,
                )
        response, taken = self._items.popleft()
        if taken is not None:
            taken()
        self._release_waiting()
        if response.is_final:
            self._is_done = True
            self._has_read_final = True
        if response.error is not None:
            return StreamedAnswer([], response.error, response.is_final)
        try:
            outputs = self._select(response.outputs)
        except ZeroserveError as exc:
            await self.aclose()
            return StreamedAnswer([], exc, True)
        return StreamedAnswer(outputs, None, response.is_final)

    async def aclose(self) -> None:
        """Stop reading. Before the final response: the model sees the request
        cancelled, a queued request leaves the queue, and responses still coming are
        dropped. After it: the execution ends on its own (its ``execute`` may still be
        returning after its sender's final flag), waited for at most ``idle_timeout_s``."""
        task = self._task
        if self._has_read_final and task is not None and not task.done():
            # Cancelling here would record an answered request as CANCELED.
            try:
                async with asyncio.timeout(self._idle_timeout_s):
                    await asyncio.shield(task)
            except asyncio.CancelledError:
                task.cancel()
                raise
            except Exception:  # the execution's failure is its own to record
                pass
        self._is_done = True
        self._is_cancelled = True
        items, self._items = self._items, deque()
        for _, taken in items:
            if taken is not None:
                taken()
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def _take(self, response: StreamedResponse, taken: Callable[[], None]) -> None:
        if self._is_done and not self._items:
            taken()
            return
        if response.is_final:
            self._has_final = True
        if len(self._items) < self._max_buffered:
            taken()
            self._items.append((response, None))
        else:
            self._items.append((response, taken))
        self._ready.set()

    def _release_waiting(self) -> None:
        for index, (response, taken) in enumerate(self._items):
            if index >= self._max_buffered:
                return
            if taken is not None:
                taken()
                self._items[index] = (response, None)

    async def _run(self) -> None:
        try:
            await self._start(self._context)
        except asyncio.CancelledError:
            raise
        except ZeroserveError as exc:
            self._fail(exc)
        except Exception as exc:
            logger.exception("the stream of model %s failed", self._model)
            self._fail(InternalError(str(exc) or type(exc).__name__))

    def _fail(self, error: ZeroserveError) -> None:
        """The execution failed: unless the model already ended the request, its error
        is the last response."""
        if self._has_final or self._is_done:
            return
        self._has_final = True
        self._items.append((StreamedResponse({}, error, True), None))
        self._ready.set()
