"""Triton's shared-memory extensions over HTTP: ``/v2/systemsharedmemory/...`` and
``/v2/cudasharedmemory/...`` (status, register, unregister; one region or all).

Bodies and answers are Triton's: register takes ``{"key", "offset", "byte_size"}`` (system)
or ``{"raw_handle": {"b64"}, "device_id", "byte_size"}`` (CUDA) and answers 200 with an
empty body, as unregister does; status answers a JSON list of regions. A register body
Triton cannot parse is answered as Triton answers it: 500 for bad JSON or a member of the
wrong type, 400 for a missing ``key``, ``byte_size`` or ``raw_handle``.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Final

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from data_plane.errors import InvalidArgumentError
from data_plane.handlers import SharedMemoryHandlers
from data_plane.protocol.json_data import NOT_STRING, NOT_UINT
from data_plane.routes.body import read_body
from data_plane.shared_memory import SharedMemoryRequestError

_MAX_BODY_BYTES: Final = 1 << 20
_CUDA_IPC_HANDLE_BYTES: Final = 64  # sizeof(cudaIpcMemHandle_t)
_UINT64_MAX: Final = 2**64 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_NOT_INT: Final = "attempt to access JSON non-signed-integer as signed-integer"


def _handlers(request: Request) -> SharedMemoryHandlers:
    handlers: SharedMemoryHandlers = request.state.handlers.shared_memory
    return handlers


def _region(request: Request) -> str | None:
    name: str | None = request.path_params.get("name")
    return name


def _done() -> Response:
    # Triton's answer to a register or unregister: 200, no body, typed as JSON.
    return Response(status_code=200, media_type="application/json")


def _json(rows: list[dict[str, Any]]) -> Response:
    return Response(orjson.dumps(rows), media_type="application/json")


async def _register_body(request: Request) -> dict[str, Any]:
    body = await read_body(request, _MAX_BODY_BYTES)
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise SharedMemoryRequestError(
            f"failed to parse the request JSON buffer: {exc.msg} at {exc.pos}"
        ) from None
    return doc if isinstance(doc, dict) else {}


def _required(doc: dict[str, Any], member: str) -> object:
    if member not in doc:
        raise InvalidArgumentError(f"Shared memory register request has no '{member}' field")
    return doc[member]


def _member(doc: dict[str, Any], member: str) -> object:
    if member not in doc:
        raise SharedMemoryRequestError(f"attempt to access non-existing object member '{member}'")
    return doc[member]


def _uint(value: object) -> int:
    if type(value) is not int or not 0 <= value <= _UINT64_MAX:
        raise SharedMemoryRequestError(NOT_UINT)
    return value


def _string(value: object) -> str:
    if not isinstance(value, str):
        raise SharedMemoryRequestError(NOT_STRING)
    return value


async def system_status(request: Request) -> Response:
    regions = _handlers(request).system.status(_region(request))
    return _json(
        [
            {"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
            for r in regions
        ]
    )


async def system_register(request: Request) -> Response:
    name = request.path_params["name"]
    doc = await _register_body(request)
    # Triton's order of checks, which decides the answer when several members are wrong.
    key = _string(_required(doc, "key"))
    offset = _uint(doc.get("offset", 0))
    byte_size = _uint(_required(doc, "byte_size"))
    _handlers(request).system.register(name, key, offset, byte_size)
    return _done()


async def system_unregister(request: Request) -> Response:
    _handlers(request).system.unregister(_region(request))
    return _done()


async def cuda_status(request: Request) -> Response:
    regions = _handlers(request).cuda.status(_region(request))
    return _json(
        [{"name": r.name, "device_id": r.device_id, "byte_size": r.byte_size} for r in regions]
    )


async def cuda_register(request: Request) -> Response:
    name = request.path_params["name"]
    doc = await _register_body(request)
    raw_handle = _required(doc, "raw_handle")
    encoded = _string(_member(raw_handle if isinstance(raw_handle, dict) else {}, "b64"))
    device_id = _member(doc, "device_id")
    if type(device_id) is not int or not _INT64_MIN <= device_id <= _INT64_MAX:
        raise SharedMemoryRequestError(_NOT_INT)
    byte_size = _uint(_member(doc, "byte_size"))
    try:
        handle = base64.b64decode(encoded, validate=True)
    except binascii.Error:
        handle = b""
    if len(handle) != _CUDA_IPC_HANDLE_BYTES:
        raise InvalidArgumentError("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")
    _handlers(request).cuda.register(name, handle, device_id, byte_size)


async def cuda_unregister(request: Request) -> Response:
    _handlers(request).cuda.unregister(_region(request))
    return _done()


routes = [
    Route("/v2/systemsharedmemory/status", system_status, methods=["GET"]),
    Route("/v2/systemsharedmemory/region/{name}/status", system_status, methods=["GET"]),
    Route("/v2/systemsharedmemory/region/{name}/register", system_register, methods=["POST"]),
    Route("/v2/systemsharedmemory/unregister", system_unregister, methods=["POST"]),
    Route("/v2/systemsharedmemory/region/{name}/unregister", system_unregister, methods=["POST"]),
    Route("/v2/cudasharedmemory/status", cuda_status, methods=["GET"]),
    Route("/v2/cudasharedmemory/region/{name}/status", cuda_status, methods=["GET"]),
    Route("/v2/cudasharedmemory/region/{name}/register", cuda_register, methods=["POST"]),
    Route("/v2/cudasharedmemory/unregister", cuda_unregister, methods=["POST"]),
    Route("/v2/cudasharedmemory/region/{name}/unregister", cuda_unregister, methods=["POST"]),
]
