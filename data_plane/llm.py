"""What the LLM surfaces (OpenAI, Triton generate) share: finding the engine, SSE framing,
and cancelling work whose client left."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

import orjson
from starlette.types import Receive

from data_plane.errors import InvalidArgumentError
from data_plane.repository import LoadedVersion, ModelRepository
from data_plane.routes.body import ClientDisconnectedError
from runtimes.llm.base import LLMRuntime

_T = TypeVar("_T")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
"""Event streams must reach the client as they are written, not when a proxy's buffer fills."""


class NotALanguageModelError(InvalidArgumentError):
    """The model exists but is served by a runtime that does not generate text."""

    def __init__(self, *, model: str, kind: str) -> None:
        super().__init__(f"model '{model}' ({kind}) is not a language model")
        self.model = model


def language_model(
    repository: ModelRepository, name: str, version: int | None = None
) -> tuple[LoadedVersion, LLMRuntime]:
    """The serving version of ``name`` and its LLM engine.

    Raises what :meth:`ModelRepository.get` raises, and NotALanguageModelError.
    """
    model = repository.get(name, version)
    runtime = model.runtime
    if not isinstance(runtime, LLMRuntime):
        raise NotALanguageModelError(model=name, kind=runtime.kind)
    return model, runtime


def sse_event(doc: Any) -> bytes:
    """One server-sent event carrying ``doc`` as JSON."""
    return b"data: " + orjson.dumps(doc) + b"\n\n"


async def until_disconnected(receive: Receive, work: Awaitable[_T]) -> _T:
    """``work``'s result, or ClientDisconnectedError once the client leaves first (``work``
    is then cancelled, which aborts a generation in its engine).

    Call only after the request body was read: the next ASGI message is then the
    disconnect.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
        await asyncio.gather(task, watcher, return_exceptions=True)
    if task.cancelled():
        raise ClientDisconnectedError()
    return task.result()


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
