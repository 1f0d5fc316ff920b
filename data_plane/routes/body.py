"""The receiving side of an ASGI request: its body, read with a size limit, and the client
going away."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

import orjson
from starlette.requests import Request
from starlette.types import Message, Receive

from data_plane.errors import InvalidArgumentError

_T = TypeVar("_T")


class ClientDisconnectedError(Exception):
    """The client went away before its request body arrived; there is no one to answer."""


def _too_large(size: int, limit: int) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"request body of {size} bytes exceeds the maximum allowed value of {limit} bytes. "
        "Use --http-max-input-size to increase the limit."
    )


async def read_asgi_body(receive: Receive, declared: bytes | None, max_bytes: int) -> bytes:
    """The whole body from ASGI ``receive``, refusing one over ``max_bytes`` before reading
    it all (``declared`` is the Content-Length header, if any)."""
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise InvalidArgumentError(f"invalid Content-Length header: {declared!r}") from None
        if size > max_bytes:
            raise _too_large(size, max_bytes)
    chunks: list[bytes] = []
    total = 0
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnectedError()
        chunk: bytes = message.get("body", b"")
        if chunk:
            total += len(chunk)
            if total > max_bytes:
                raise _too_large(total, max_bytes)
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    if len(chunks) == 1:
        return bytes(chunks[0])
    return b"".join(chunks)


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The whole body of a Starlette request, with the same limit."""
    declared = request.headers.get("content-length")
    return await read_asgi_body(
        request.receive, None if declared is None else declared.encode("latin-1"), max_bytes
    )


def json_object(body: bytes) -> dict[str, Any]:
    """``body`` parsed as a JSON object; InvalidArgumentError (400) for anything else."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgumentError(f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidArgumentError("the request body must be a JSON object")
    return doc


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
