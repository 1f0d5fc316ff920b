"""``POST /v2/models/{name}[/versions/{version}]/infer``: the hot path, as pure ASGI.

Profiling showed Starlette's routing (a dozen regex matches), its middleware and exception
wrappers and two Request objects costing more per request than decoding and batching
together, so infer requests are recognised by string operations and answered here: this
module decodes and encodes, the infer handler does the work. The app itself is
:class:`InferFirst`: an infer request never enters Starlette's middleware stack; every other
request goes through it. Errors map through the same table (`data_plane.http_errors`)
as everywhere else.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Mapping
from typing import Any, cast

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from data_plane.compression import choose_response_encoding, decode_body_off_loop, encode_body
from data_plane.errors import ZeroserveError
from data_plane.http_errors import from_error
from data_plane.protocol import decode_infer_request, encode_infer_response, parse_header_length
from data_plane.repository import LoadedVersion
from data_plane.routes.body import ClientDisconnectedError, read_asgi_body
from data_plane.routes.state import ServerState
from foundation.http import INTERNAL_ERROR, direct_response
from foundation.http_direct import DirectHandler, DirectResponse
from foundation.model_config import is_version
from foundation.request_ids import HEADER, find_request_id

logger = logging.getLogger(__name__)

_PREFIX = "/v2/models/"
_SUFFIX = "/infer"
_DECOUPLED = "HTTP end point doesn't support models with decoupled transaction policy"
_JSON = (b"content-type", b"application/json")
_BINARY = (b"content-type", b"application/octet-stream")


def match_infer_path(path: str) -> tuple[str, int | None] | None:
    """(model, version) when ``path`` is an infer path, else None (let the router decide)."""
    if not path.startswith(_PREFIX) or not path.endswith(_SUFFIX):
        return None
    parts = path[len(_PREFIX) : -len(_SUFFIX)].split("/")
    if len(parts) == 1 and parts[0]:
        return parts[0], None
    if len(parts) == 3 and parts[0] and parts[1] == "versions" and is_version(parts[2]):
        return parts[0], int(parts[2])
    return None


class InferFirst(Starlette):
    """Starlette that answers infer requests itself, before its middleware stack.

    Starlette puts every middleware inside its error layer, and its routing and exception
    layers cost more than the inference itself on small models: an infer request skips them
    all (its errors are answered here, as the layers would), anything else goes through.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if scope["method"] == "POST":
                target = match_infer_path(scope["path"])
                if target is not None:
                    scope["app"] = self
                    await _infer(scope, receive, send, *target)
                    return
            request_id = find_request_id(scope["headers"])
            if request_id is not None:
                send = _naming_request_id_on_errors(send, request_id)
        await super().__call__(scope, receive, send)


def _naming_request_id_on_errors(send: Send, request_id: bytes) -> Send:
    """``send``, adding ``X-Request-ID`` to an error answer's head (success answers stay
    byte for byte Triton's)."""

    async def send_with_id(message: Message) -> None:
        if message["type"] == "http.response.start" and message["status"] >= 400:
            headers = [*message.get("headers", ()), (HEADER, request_id)]
            message = {**message, "headers": headers}
        await send(message)

    return send_with_id


async def _infer(
    scope: Scope, receive: Receive, send: Send, name: str, version: int | None
) -> None:
    state: ServerState = scope["state"]
    headers = dict(scope["headers"])
    try:
        answer = _handle(state, headers, receive, name, version)
        response = await _guarded(name, answer, headers.get(HEADER))
    except ClientDisconnectedError:
        return
    response_headers = [*response.headers, (b"content-length", b"%d" % len(response.body))]
    start = {"type": "http.response.start", "status": response.status, "headers": response_headers}
    await send(start)
    await send({"type": "http.response.body", "body": response.body})


class DirectInfer:
    """The infer paths as `foundation.http_direct.DirectRoutes`: on a real server an infer
    request is answered on its connection, past uvicorn's ASGI cycle, with the same answers
    (:class:`InferFirst` answers those that do not go direct, and every request of an
    in-process client). A percent-encoded path goes the ASGI way, which decodes it."""

    def route(
        self, method: bytes, path: bytes, state: Mapping[str, Any]
    ) -> tuple[DirectHandler, int] | None:
        if method != b"POST" or b"%" in path or not path.isascii():
            return None
        target = match_infer_path(path.decode("ascii"))
        if target is None:
            return None
        server_state = cast(ServerState, state)
        handler = functools.partial(_answer_directly, server_state, *target)
        return handler, server_state["settings"].max_input_bytes


async def _answer_directly(
    state: ServerState,
    name: str,
    version: int | None,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
) -> DirectResponse:
    by_name = dict(headers)
    answer = _handle_body(state, by_name, body, name, version)
    return await _guarded(name, answer, by_name.get(HEADER))


async def _guarded(
    name: str,
    answer: Awaitable[tuple[list[tuple[bytes, bytes]], bytes]],
    request_id: bytes | None,
) -> DirectResponse:
    """What ``answer`` gives, or its error as the answer: a ZeroserveError through the data
    plane's table, anything unexpected as a logged 500, either naming ``request_id`` (the
    request's ``X-Request-ID``, when it has one) in the same header. A client gone before
    its body arrived is no answer at all: ClientDisconnectedError passes through."""
    try:
        response_headers, payload = await answer
    except ZeroserveError as exc:
        return _with_request_id(direct_response(from_error(exc)), request_id)
    except ClientDisconnectedError:
        raise
    except Exception:
        logger.exception(
            "unexpected error serving infer for %s (request id %s)",
            name,
            "-" if request_id is None else request_id.decode("latin-1"),
        )
        return _with_request_id(INTERNAL_ERROR, request_id)
    return DirectResponse(200, response_headers, payload)


def _with_request_id(response: DirectResponse, request_id: bytes | None) -> DirectResponse:
    if request_id is None:
        return response
    return DirectResponse(response.status, [*response.headers, (HEADER, request_id)], response.body)


def _model(state: ServerState, name: str, version: int | None) -> LoadedVersion:
    handler = state["handlers"].infer
    model = handler.model(name, version)
    handler.check_not_decoupled(model, _DECOUPLED)
    return model


async def _handle(
    state: ServerState,
    headers: dict[bytes, bytes],
    receive: Receive,
    name: str,
    version: int | None,
) -> tuple[list[tuple[bytes, bytes]], bytes]:
    model = _model(state, name, version)
    max_bytes = state["settings"].max_input_bytes
    body = await read_asgi_body(receive, headers.get(b"content-length"), max_bytes)
    return await _answer(state, headers, body, model)


async def _handle_body(
    state: ServerState, headers: dict[bytes, bytes], body: bytes, name: str, version: int | None
) -> tuple[list[tuple[bytes, bytes]], bytes]:
    return await _answer(state, headers, body, _model(state, name, version))


async def _answer(
    state: ServerState, headers: dict[bytes, bytes], body: bytes, model: LoadedVersion
) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """The answer's headers and payload for a request of ``model`` with this body."""
    handler = state["handlers"].infer
    max_bytes = state["settings"].max_input_bytes
    encoding = headers.get(b"content-encoding")
    if encoding is not None:
        body = await decode_body_off_loop(body, encoding.decode("latin-1"), max_bytes=max_bytes)
    header_length = headers.get(b"inference-header-content-length")
    request = decode_infer_request(
        body,
        header_length=parse_header_length(
            None if header_length is None else header_length.decode("latin-1"),
            content_length=len(body),
        ),
        model=model.name,
        max_input_bytes=max_bytes,
    )
    response = await handler.infer(model, request)
    payload, json_length = encode_infer_response(
        model_name=response.model_name,
        model_version=response.model_version,
        request_id=response.id,
        outputs=response.outputs,
    )
    response_headers: list[tuple[bytes, bytes]]
    if json_length is None:
        response_headers = [_JSON]
    else:
        response_headers = [_BINARY, (b"inference-header-content-length", b"%d" % json_length)]
    accept = headers.get(b"accept-encoding")
    if accept is not None:
        chosen = choose_response_encoding(accept.decode("latin-1"))
        if chosen is not None:
            payload = encode_body(payload, chosen)
            response_headers.append((b"content-encoding", chosen.encode()))
    return response_headers, payload


async def _answered_before_routing(request: Request) -> Response:
    # InferEndpoint answers every POST these routes match; they exist so that other
    # methods on an infer path get 405, as in Triton.
    raise HTTPException(404)


routes = [
    Route("/v2/models/{name}/infer", _answered_before_routing, methods=["POST"]),
    Route("/v2/models/{name}/versions/{version}/infer", _answered_before_routing, methods=["POST"]),
]
