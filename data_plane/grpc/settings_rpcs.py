"""TraceSetting and LogSettings: their protobuf messages to the trace and logging handlers'
types and back, with Triton's gRPC checks and texts.

A TraceSetting request changes the setting when it names any setting: a value list with no
values clears that field (it falls back), one value sets it, more are refused (a level takes
several names); settings Triton does not know are ignored, as Triton ignores them, and
``trace_file`` cannot be changed over the network. A LogSettings request takes each setting
in its own type (booleans for the severities, an unsigned integer for the verbose level, a
string for the format).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Final, TypeVar

from data_plane.errors import InvalidArgumentError, UnsupportedError
from data_plane.log_settings import LogSettings, LogUpdate, parse_log_format
from data_plane.trace import (
    TraceUpdate,
    TraceValues,
    parse_count,
    parse_level,
    parse_log_frequency,
    parse_rate,
)
from foundation.proto import grpc_service_pb2 as pb

_T = TypeVar("_T")

_UINT32_MASK: Final = 2**32 - 1
_TRACE_FILE: Final = "trace_file"
_LOG_FILE: Final = "log_file"


def trace_update(settings: Mapping[str, pb.TraceSettingRequest.SettingValue]) -> TraceUpdate:
    """The change a TraceSetting request asks for (its ``settings`` not empty)."""
    if _TRACE_FILE in settings:
        raise UnsupportedError("trace file location can not be updated through network protocol")
    cleared: set[str] = set()
    level = None
    if "trace_level" in settings:
        names = settings["trace_level"].value[:]
        if names:
            level = parse_level(names)
        else:
            cleared.add("trace_level")
    rate = _single(settings, "trace_rate", parse_rate, cleared)
    count = _single(
        settings, "trace_count", lambda text: parse_count(text, got_separator=": "), cleared
    )
    log_frequency = _single(settings, "log_frequency", parse_log_frequency, cleared)
    return TraceUpdate(
        level=level,
        rate=rate,
        count=count,
        log_frequency=log_frequency,
        cleared=frozenset(cleared),
    )


def _single(
    settings: Mapping[str, pb.TraceSettingRequest.SettingValue],
    name: str,
    parse: Callable[[str], _T],
    cleared: set[str],
) -> _T | None:
    if name not in settings:
        return None
    values: Sequence[str] = settings[name].value[:]
    if not values:
        cleared.add(name)
        return None
    if len(values) > 1:
        raise InvalidArgumentError(f"expect only 1 value for '{name}'")
    return parse(values[0])


def trace_response(values: TraceValues) -> pb.TraceSettingResponse:
    response = pb.TraceSettingResponse()
    settings = response.settings
    settings["trace_level"].value.extend(values.level.names)
    settings["trace_rate"].value.append(str(values.rate))
    settings["trace_count"].value.append(str(values.count))
    if values.mode == "triton":  # the file settings are the triton mode's own
        settings["log_frequency"].value.append(str(values.log_frequency))
        settings[_TRACE_FILE].value.append(values.file)
    settings["trace_mode"].value.append(values.mode)
    return response


_LOG_TYPES: Final = {
    "log_info": "bool_param",
    "log_warning": "bool_param",
    "log_error": "bool_param",
    "log_verbose_level": "uint32_param",
    "log_format": "string_param",
}
_TYPE_NAMES: Final = {"bool_param": "boolean", "uint32_param": "int32", "string_param": "string"}


def log_update(settings: Mapping[str, pb.LogSettingsRequest.SettingValue]) -> LogUpdate:
    """The change a LogSettings request asks for (its ``settings`` not empty), checked in
    Triton's order."""
    if _LOG_FILE in settings:
        raise UnsupportedError("log file location can not be updated through network protocol")
    values: dict[str, object] = {}
    for name, choice in _LOG_TYPES.items():
        setting = settings.get(name)
        if setting is None:
            continue
        if setting.WhichOneof("parameter_choice") != choice:
            raise InvalidArgumentError(f"expect {_TYPE_NAMES[choice]} for '{name}'")
        values[name] = getattr(setting, choice)
    log_format = None
    if "log_format" in values:
        text = str(values["log_format"])
        log_format = parse_log_format(text)
        if log_format is None:
            raise InvalidArgumentError(f"invalid argument for log_format, got: {text}")
    return LogUpdate(
        log_info=_bool_or_none(values.get("log_info")),
        log_warning=_bool_or_none(values.get("log_warning")),
        log_error=_bool_or_none(values.get("log_error")),
        log_verbose_level=_int_or_none(values.get("log_verbose_level")),
        log_format=log_format,
    )


def _bool_or_none(value: object) -> bool | None:
    return None if value is None else bool(value)


def _int_or_none(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[call-overload]


def log_response(settings: LogSettings) -> pb.LogSettingsResponse:
    response = pb.LogSettingsResponse()
    values = response.settings
    values[_LOG_FILE].string_param = settings.log_file
    values["log_info"].bool_param = settings.log_info
    values["log_warning"].bool_param = settings.log_warning
    values["log_error"].bool_param = settings.log_error
    # Triton keeps the level as a C int and sends it as uint32: a negative one wraps.
    values["log_verbose_level"].uint32_param = settings.log_verbose_level & _UINT32_MASK
    values["log_format"].string_param = settings.log_format.value
    return response
