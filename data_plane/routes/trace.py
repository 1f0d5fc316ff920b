"""Trace settings over HTTP: ``GET``/``POST`` ``/v2/trace/setting`` (the server's) and
``/v2/models/{name}/trace/setting`` (a model's), answered as Triton answers them.

Triton's HTTP front end reads each value as a JSON string (``"trace_rate": "100"``) and the
level as an array of strings; a value of another JSON type is answered 500 with its JSON
library's text, and ``null`` clears the value. The body's JSON is read as Triton's library
reads it: a body that is not an object sets nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from data_plane.errors import InternalError, UnsupportedError
from data_plane.handlers.trace import TraceHandler
from data_plane.routes.body import read_body
from data_plane.trace import (
    TraceLevel,
    TraceUpdate,
    TraceValues,
    parse_count,
    parse_level,
    parse_log_frequency,
    parse_rate,
)
from data_plane.trace.values import COUNT, FILE, LEVEL, LOG_FREQUENCY, RATE

NOT_STRING = "attempt to access JSON non-string as string"
NOT_ARRAY = "attempt to access JSON non-array as array"


async def server_setting(request: Request) -> Response:
    return await _setting(request, None)


async def model_setting(request: Request) -> Response:
    return await _setting(request, request.path_params["name"])


async def _setting(request: Request, model: str | None) -> Response:
    handler: TraceHandler = request.state.handlers.trace
    if request.method == "POST":
        handler.check_model(model)  # before the body, as in Triton
        body = await read_body(request, request.state.settings.max_input_bytes)
        values = handler.update(model, _update(settings_json(body)))
    else:
        values = handler.settings(model)
    return Response(orjson.dumps(_answer(values)), media_type="application/json")


def settings_json(body: bytes) -> dict[str, Any]:
    """The members of a settings request body, as Triton's JSON reader (RapidJSON) sees
    them: the first of duplicate names counts, NaN is not JSON, and a document that is not
    an object has no members. Malformed JSON is Triton's 500."""
    try:
        doc = json.loads(
            body,
            object_pairs_hook=_first_wins,
            parse_constant=_no_constant,
        )
    except (ValueError, UnicodeDecodeError) as exc:
        if not body.strip():
            reason = f"The document is empty. at {len(body)}"
        elif isinstance(exc, json.JSONDecodeError):
            reason = f"{exc.msg} at {exc.pos}"
        else:
            reason = "Invalid value. at 0"
        raise InternalError(f"failed to parse the request JSON buffer: {reason}") from None
    return doc if isinstance(doc, dict) else {}


def _first_wins(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    members: dict[str, Any] = {}
    for name, value in pairs:
        members.setdefault(name, value)
    return members


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _update(members: dict[str, Any]) -> TraceUpdate:
    """The change the members ask for, checked in Triton's order (the first error wins)."""
    if FILE in members:
        raise UnsupportedError("trace file location can not be updated through network protocol")
    cleared = {name for name in (LEVEL, RATE, COUNT, LOG_FREQUENCY) if members.get(name, 0) is None}
    level: TraceLevel | None = None
    if LEVEL in members and LEVEL not in cleared:
        names = members[LEVEL]
        if not isinstance(names, list):
            raise InternalError(NOT_ARRAY)
        # Triton reads the names in order: the first that is not a string, or an "OFF"
        # among others, fails the request.
        for name in names:
            if name == "OFF" and len(names) > 1:
                parse_level(names)
            if not isinstance(name, str):
                raise InternalError(NOT_STRING)
        level = parse_level(names)
    rate = _value(members, RATE, cleared, parse_rate)
    count = _value(members, COUNT, cleared, parse_count)
    log_frequency = _value(members, LOG_FREQUENCY, cleared, parse_log_frequency)
    return TraceUpdate(
        level=level,
        rate=rate,
        count=count,
        log_frequency=log_frequency,
        cleared=frozenset(cleared),
    )


def _value(
    members: dict[str, Any], name: str, cleared: set[str], parse: Callable[[str], int]
) -> int | None:
    if name not in members or name in cleared:
        return None
    text = members[name]
    if not isinstance(text, str):
        raise InternalError(NOT_STRING)
    return parse(text)


def _answer(values: TraceValues) -> dict[str, Any]:
    return {
        "trace_level": list(values.level.names),
        "trace_rate": str(values.rate),
        "trace_count": str(values.count),
        "log_frequency": str(values.log_frequency),
        "trace_file": values.file,
        "trace_mode": values.mode,
    }


routes = [
    Route("/v2/trace/setting", server_setting, methods=["GET", "POST"]),
    Route("/v2/models/{name}/trace/setting", model_setting, methods=["GET", "POST"]),
]
