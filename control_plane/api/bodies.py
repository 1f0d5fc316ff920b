"""Reading an admin request's JSON body, bounded: shared by every route module."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request

from control_plane.errors import InvalidInputError

__all__ = ["MAX_BODY_BYTES", "read_json"]

MAX_BODY_BYTES = 4 * 2**20


async def read_json(request: Request) -> dict[str, Any]:
    """The request's body as a JSON object; InvalidInputError when it is larger than
    ``MAX_BODY_BYTES``, not JSON, or not an object."""
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            raise InvalidInputError(f"the request body is larger than {MAX_BODY_BYTES} bytes")
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidInputError(f"malformed JSON in the request body: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidInputError("the request body must be a JSON object")
    return doc
