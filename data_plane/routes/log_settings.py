"""Logging settings over HTTP: ``GET``/``POST`` ``/v2/logging``, answered as Triton answers.

Triton applies the settings of a request one by one, in a fixed order, and stops at the
first it cannot read: the ones before it stay applied. ``null`` leaves a setting as it is.
"""

from __future__ import annotations

from typing import Any, Final

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from data_plane.errors import InternalError, UnavailableError, UnsupportedError, ZeroserveError
from data_plane.log_settings import LogControl, LogFormat, LogSettings, LogUpdate, parse_log_format
from data_plane.routes.body import read_body
from data_plane.routes.trace import NOT_STRING, settings_json

NOT_BOOLEAN: Final = "attempt to access JSON non-boolean as boolean"
NOT_UNSIGNED: Final = "attempt to access JSON non-unsigned-integer as unsigned-integer"
_UINT64: Final = 2**64


async def logging_settings(request: Request) -> Response:
    control: LogControl = request.state.handlers.logging
    if request.method == "POST":
        body = await read_body(request, request.state.settings.max_input_bytes)
        _apply(control, settings_json(body))
    return Response(orjson.dumps(_answer(control.settings())), media_type="application/json")


def _apply(control: LogControl, members: dict[str, Any]) -> None:
    """Read the members in Triton's order; apply those read before the first error."""
    if members.get("log_file") is not None:
        raise UnsupportedError("log file location can not be updated through network protocol")
    given: dict[str, Any] = {}
    error: ZeroserveError | None = None
    try:
        for name in ("log_info", "log_warning", "log_error"):
            value = members.get(name)
            if value is not None:
                if not isinstance(value, bool):
                    raise InternalError(NOT_BOOLEAN)
                given[name] = value
        level = members.get("log_verbose_level")
        if level is not None:
            if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level < _UINT64:
                raise InternalError(NOT_UNSIGNED)
            given["log_verbose_level"] = level
        text = members.get("log_format")
        if text is not None:
            if not isinstance(text, str):
                raise InternalError(NOT_STRING)
            log_format = parse_log_format(text)
            if log_format is None:
                # Triton's HTTP front end answers this one UNAVAILABLE, naming the flag.
                raise UnavailableError(f"invalid argument for --log_format, got: {text}")
            given["log_format"] = log_format
    except ZeroserveError as exc:
        error = exc
    control.update(LogUpdate(**given))
    if error is not None:
        raise error


def _answer(settings: LogSettings) -> dict[str, Any]:
    return {
        "log_file": settings.log_file,
        "log_info": settings.log_info,
        "log_warning": settings.log_warning,
        "log_error": settings.log_error,
        "log_verbose_level": settings.log_verbose_level,
        "log_format": LogFormat(settings.log_format).value,
    }


routes = [Route("/v2/logging", logging_settings, methods=["GET", "POST"])]
