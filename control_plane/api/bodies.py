"""Reading an admin request's JSON body, bounded, and validating it against a schema: shared
by every route module (the API's and the console's)."""

from __future__ import annotations

from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from control_plane.api import schemas
from control_plane.errors import InvalidInputError

__all__ = ["MAX_BODY_BYTES", "read_json", "validate"]

MAX_BODY_BYTES = 4 * 2**20

_T = TypeVar("_T", bound=BaseModel)


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


def validate(model: type[_T], doc: dict[str, Any], request: Request) -> _T:
    """``doc`` as ``model``, validated with the storage and model-code rules the app holds
    in ``request.state``; SchemaValidationError listing every field that fails."""
    context = {
        "allowed_storage": request.state.allowed_storage,
        "allow_model_code": request.state.allow_model_code,
    }
    try:
        return model.model_validate(doc, context=context)
    except ValidationError as exc:
        raise schemas.schema_error(exc) from None
