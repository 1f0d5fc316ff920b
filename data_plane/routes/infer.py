"""``POST /v2/models/{name}[/versions/{version}]/infer``: the hot path."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from data_plane import inference
from data_plane.compression import choose_response_encoding, decode_body, encode_body
from data_plane.errors import ServerStoppingError
from data_plane.protocol import decode_infer_request, encode_infer_response, parse_header_length
from data_plane.routes.body import read_body
from data_plane.routes.models import path_version


async def infer(request: Request) -> Response:
    state = request.state
    if state.lifecycle.is_stopping:
        raise ServerStoppingError()
    max_bytes = state.settings.max_input_bytes
    headers = request.headers
    model = state.repository.get(request.path_params["name"], path_version(request))
    body = await read_body(request, max_bytes)
    encoding = headers.get("content-encoding")
    if encoding is not None:
        body = decode_body(body, encoding, max_bytes=max_bytes)
    header_length = parse_header_length(
        headers.get("inference-header-content-length"), content_length=len(body)
    )
    infer_request = decode_infer_request(
        body, header_length=header_length, model=model.name, max_input_bytes=max_bytes
    )
    outputs = await inference.infer(model, infer_request)
    payload, json_length = encode_infer_response(
        model_name=model.name,
        model_version=str(model.version),
        request_id=infer_request.id,
        outputs=outputs,
    )
    response_headers: dict[str, str] = {}
    if json_length is not None:
        response_headers["Inference-Header-Content-Length"] = str(json_length)
        media_type = "application/octet-stream"
    else:
        media_type = "application/json"
    accept = headers.get("accept-encoding")
    if accept is not None:
        chosen = choose_response_encoding(accept)
        if chosen is not None:
            payload = encode_body(payload, chosen)
            response_headers["Content-Encoding"] = chosen
    return Response(payload, media_type=media_type, headers=response_headers)


routes = [
    Route("/v2/models/{name}/infer", infer, methods=["POST"]),
    Route("/v2/models/{name}/versions/{version}/infer", infer, methods=["POST"]),
]
