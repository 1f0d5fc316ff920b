"""Reading request bodies with a size limit."""

from __future__ import annotations

from starlette.requests import Request

from data_plane.errors import InvalidArgumentError


def _too_large(size: int, limit: int) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"request body of {size} bytes exceeds the maximum allowed value of {limit} bytes. "
        "Use --http-max-input-size to increase the limit."
    )


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The whole body, refusing (before reading it all) one larger than ``max_bytes``."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise InvalidArgumentError(f"invalid Content-Length header: {declared!r}") from None
        if size > max_bytes:
            raise _too_large(size, max_bytes)
        if size == 0:
            return b""
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > max_bytes:
            raise _too_large(total, max_bytes)
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
