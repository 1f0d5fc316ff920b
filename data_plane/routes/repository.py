"""Triton's model repository extension (index, load, unload), and sleep and wake.

``POST /v2/repository/models/{name}/sleep`` and ``.../wake`` (explicit mode only, empty body
or ``{}``) are zeroserve's, for models whose runtime can sleep (LLM engines): sleep takes
the model out of service, lets its requests finish and puts its engine to sleep (KV cache
freed, weights in host memory; the index shows the version ``SLEEPING``); wake puts it back
in service without reading the weights again. Both answer 200 once done, 501 for a runtime
that cannot sleep, and 404 when nothing of the model is loaded. The control plane's reaper
sleeps idle LLMs with the first, and an activation wakes them with the second.

``GET /v2/repository/models/{name}/sequences`` (zeroserve's, any mode) answers
``{"name", "live"}``: how many sequences of a sequence model run on this server (0 for any
other model, or one not loaded); the control plane asks it before taking a replica away.

``GET /v2/repository/models/{name}/progress`` (zeroserve's, any mode) answers ``{"name",
"fetching", "bytes_fetched", "bytes_total"}``: while a load downloads the model's files into
the node cache, the bytes written so far (part by part) and those it needs; ``fetching``
false (and nulls) otherwise. The control plane asks it during a load, for the live
activation timeline.

A load may carry zeroserve's ``allow_model_code`` parameter (a boolean, default true):
false refuses a model that is code (a Python-backend ``model.py``, a PyTorch program), which
the control plane sends unless its operator allows such models.

A successful load answers 200 with ``{"cache": "hit" | "miss" | "local", "bytes_fetched",
"fetch_s"}``: whether the node cache held the model's files, downloaded them, or read them
in place from a local folder, for this load alone (Triton's body is empty).
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from data_plane.errors import InvalidArgumentError
from data_plane.handlers import RepositoryHandlers
from data_plane.repository import IndexEntry
from data_plane.routes.body import json_object, read_body

_MAX_CONTROL_BODY = 16 * 2**20


async def _json_body(request: Request) -> dict[str, Any]:
    body = await read_body(request, _MAX_CONTROL_BODY)
    if not body.strip():
        return {}
    return json_object(body)


def _parameters(doc: dict[str, Any]) -> dict[str, Any]:
    parameters = doc.get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidArgumentError("Unable to parse 'parameters': expected a JSON object")
    return parameters


def _handler(request: Request) -> RepositoryHandlers:
    handler: RepositoryHandlers = request.state.handlers.repository
    return handler


def _controlled(request: Request) -> tuple[RepositoryHandlers, str | None]:
    """The handler, once model control is allowed here: refused before the body is read."""
    handler = _handler(request)
    repository_name: str | None = request.path_params.get("repository")
    handler.check_control(repository_name)
    return handler, repository_name


def _row(entry: IndexEntry) -> dict[str, Any]:
    if entry.version is None:
        return {"name": entry.name}
    row: dict[str, Any] = {"name": entry.name, "version": str(entry.version), "state": entry.state}
    if entry.reason:
        row["reason"] = entry.reason
    return row


async def index(request: Request) -> Response:
    doc = await _json_body(request)
    ready_only = doc.get("ready", False)
    if not isinstance(ready_only, bool):
        raise InvalidArgumentError("Invalid value for 'ready': expected a boolean")
    entries = await _handler(request).index(ready_only=ready_only)
    return Response(orjson.dumps([_row(e) for e in entries]), media_type="application/json")


async def load(request: Request) -> Response:
    handler, repository_name = _controlled(request)
    parameters = _parameters(await _json_body(request))
    fetched = await handler.load(
        request.path_params["name"], parameters, repository_name=repository_name
    )
    # Triton answers an empty body; Triton's clients read only the status, so the body can
    # say where the files came from (the control plane's cold-start timeline uses it).
    return Response(orjson.dumps(fetched.to_json()), media_type="application/json")


async def unload(request: Request) -> Response:
    handler, repository_name = _controlled(request)
    parameters = _parameters(await _json_body(request))
    await handler.unload(request.path_params["name"], parameters, repository_name=repository_name)
    return Response(status_code=200)


async def sleep(request: Request) -> Response:
    handler, repository_name = _controlled(request)
    await _json_body(request)
    await handler.sleep(request.path_params["name"], repository_name=repository_name)
    return Response(status_code=200)


async def wake(request: Request) -> Response:
    handler, repository_name = _controlled(request)
    await _json_body(request)
    await handler.wake(request.path_params["name"], repository_name=repository_name)
    return Response(status_code=200)


async def sequences(request: Request) -> Response:
    name: str = request.path_params["name"]
    live = _handler(request).live_sequences(name)
    return Response(orjson.dumps({"name": name, "live": live}), media_type="application/json")


async def progress(request: Request) -> Response:
    name: str = request.path_params["name"]
    fetch = _handler(request).fetch_progress(name)
    doc = {
        "name": name,
        "fetching": fetch is not None,
        "bytes_fetched": fetch[0] if fetch else None,
        "bytes_total": fetch[1] if fetch else None,
    }
    return Response(orjson.dumps(doc), media_type="application/json")


routes = [
    Route("/v2/repository/index", index, methods=["POST"]),
    Route("/v2/repository/models/{name}/progress", progress, methods=["GET"]),
    Route("/v2/repository/models/{name}/sleep", sleep, methods=["POST"]),
    Route("/v2/repository/models/{name}/wake", wake, methods=["POST"]),
    Route("/v2/repository/models/{name}/sequences", sequences, methods=["GET"]),
    Route("/v2/repository/{repository}/index", index, methods=["POST"]),
    Route("/v2/repository/models/{name}/load", load, methods=["POST"]),
    Route("/v2/repository/models/{name}/unload", unload, methods=["POST"]),
    Route("/v2/repository/{repository}/models/{name}/load", load, methods=["POST"]),
    Route("/v2/repository/{repository}/models/{name}/unload", unload, methods=["POST"]),
]
