"""Triton's model repository extension (index, load, unload), and sleep and wake.

``POST /v2/repository/models/{name}/sleep`` and ``.../wake`` (explicit mode only, empty body
or ``{}``) are zeroserve's, for models whose runtime can sleep (LLM engines): sleep takes
the model out of service, lets its requests finish and puts its engine to sleep (KV cache
freed, weights in host memory; the index shows the version ``SLEEPING``); wake puts it back
in service without reading the weights again. Both answer 200 once done, 501 for a runtime
that cannot sleep, and 404 when nothing of the model is loaded. The control plane's reaper
sleeps idle LLMs with the first, and an activation wakes them with the second.

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

from data_plane.errors import InvalidArgumentError, UnavailableError, UnsupportedError
from data_plane.repository import ModelRepository
from data_plane.routes.body import json_object, read_body
from data_plane.state import is_explicit

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


def _require_explicit(request: Request) -> None:
    if not is_explicit(request.state.settings):
        # Triton gives this text in every non-explicit mode, 'none' included.
        raise UnavailableError("explicit model load / unload is not allowed if polling is enabled")
    if request.path_params.get("repository") is not None:
        raise UnsupportedError("'repository_name' specification is not supported")


async def index(request: Request) -> Response:
    doc = await _json_body(request)
    ready_only = doc.get("ready", False)
    if not isinstance(ready_only, bool):
        raise InvalidArgumentError("Invalid value for 'ready': expected a boolean")
    repository: ModelRepository = request.state.repository
    rows = await repository.index(ready_only=ready_only)
    return Response(orjson.dumps(rows), media_type="application/json")


async def load(request: Request) -> Response:
    _require_explicit(request)
    parameters = _parameters(await _json_body(request))
    config: str | None = None
    storage_uri: str | None = None
    allow_model_code = True
    for key, value in parameters.items():
        if key == "config":
            if not isinstance(value, str):
                raise InvalidArgumentError("Invalid config override: expected a JSON string")
            config = value
        elif key == "storage_uri":
            if not isinstance(value, str) or not value:
                raise InvalidArgumentError("Invalid storage_uri: expected a non-empty string")
            storage_uri = value
        elif key == "allow_model_code":
            if not isinstance(value, bool):
                raise InvalidArgumentError("Invalid allow_model_code: expected a boolean")
            allow_model_code = value
        else:
            raise InvalidArgumentError(
                f"Unrecognized load parameter '{key}' with type '{type(value).__name__}'"
            )
    repository: ModelRepository = request.state.repository
    fetched = await repository.load(
        request.path_params["name"],
        config_override=config,
        storage_uri=storage_uri,
        allow_model_code=allow_model_code,
    )
    # Triton answers an empty body; Triton's clients read only the status, so the body can
    # say where the files came from (the control plane's cold-start timeline uses it).
    return Response(orjson.dumps(fetched.to_json()), media_type="application/json")


async def unload(request: Request) -> Response:
    _require_explicit(request)
    parameters = _parameters(await _json_body(request))
    dependents = parameters.get("unload_dependents", False)
    if not isinstance(dependents, bool):
        raise InvalidArgumentError("Unable to parse 'unload_dependents': expected a boolean")
    repository: ModelRepository = request.state.repository
    await repository.unload(request.path_params["name"])
    return Response(status_code=200)


async def sleep(request: Request) -> Response:
    _require_explicit(request)
    await _json_body(request)
    repository: ModelRepository = request.state.repository
    await repository.sleep(request.path_params["name"])
    return Response(status_code=200)


async def wake(request: Request) -> Response:
    _require_explicit(request)
    await _json_body(request)
    repository: ModelRepository = request.state.repository
    await repository.wake(request.path_params["name"])
    return Response(status_code=200)


routes = [
    Route("/v2/repository/index", index, methods=["POST"]),
    Route("/v2/repository/models/{name}/sleep", sleep, methods=["POST"]),
    Route("/v2/repository/models/{name}/wake", wake, methods=["POST"]),
    Route("/v2/repository/{repository}/index", index, methods=["POST"]),
    Route("/v2/repository/models/{name}/load", load, methods=["POST"]),
    Route("/v2/repository/models/{name}/unload", unload, methods=["POST"]),
    Route("/v2/repository/{repository}/models/{name}/load", load, methods=["POST"]),
    Route("/v2/repository/{repository}/models/{name}/unload", unload, methods=["POST"]),
]
