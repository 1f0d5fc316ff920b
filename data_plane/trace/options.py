"""Triton's ``--trace-config`` options, read into :class:`~data_plane.trace.TraceConfig`'s
fields the way ``tritonserver`` reads them: ``<setting>=<value>`` for the settings of every
mode (``level``, ``rate``, ``count``, ``mode``) and ``<mode>,<setting>=<value>`` for a mode's
own (``triton,file=``, ``triton,log-frequency=``, ``opentelemetry,url=``,
``opentelemetry,resource=<key>=<value>``, ``opentelemetry,bsp_*=``).

Where Triton ignores a setting it does not know, this refuses it: a misspelt option that
silently leaves tracing off is worse than a server that does not start. Numbers are checked
when the settings are built.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_MODES = ("triton", "opentelemetry")

_LEVELS = {
    "off": "OFF",
    "false": "OFF",
    "timestamps": "TIMESTAMPS",
    "true": "TIMESTAMPS",
    "on": "TIMESTAMPS",
    "min": "TIMESTAMPS",
    "max": "TIMESTAMPS",
    "tensors": "TENSORS",
}
"""Triton's names for the levels, read case-insensitively."""

_MODE_OPTIONS: dict[str, dict[str, str]] = {
    "": {"rate": "trace_rate", "count": "trace_count"},
    "triton": {"file": "trace_file", "log-frequency": "trace_log_frequency"},
    "opentelemetry": {
        "url": "trace_otel_url",
        "bsp_max_queue_size": "trace_otel_bsp_max_queue_size",
        "bsp_schedule_delay": "trace_otel_bsp_schedule_delay_ms",
        "bsp_max_export_batch_size": "trace_otel_bsp_max_export_batch_size",
    },
}

_HINTS = {
    "file": " (the trace file is triton mode's: triton,file=<path>)",
    "log-frequency": " (triton mode's: triton,log-frequency=<n>)",
    "log_frequency": " (triton mode's: triton,log-frequency=<n>)",
    "url": " (opentelemetry mode's: opentelemetry,url=<url>)",
}


def trace_config_overrides(options: Sequence[str]) -> dict[str, Any]:
    """:class:`~data_plane.trace.TraceConfig` fields from ``--trace-config`` options, in
    order (a later value of a setting wins; ``level`` adds up, and ``OFF`` anywhere turns
    tracing off, as in Triton). Raises ValueError with Triton's text for a malformed option
    or unknown mode, and for a setting Triton would ignore."""
    fields: dict[str, Any] = {}
    levels: list[str] = []
    resource: list[str] = []
    for option in options:
        mode, name, value = _split(option)
        if mode == "" and name == "level":
            levels.append(_level(value))
        elif mode == "" and name == "mode":
            fields["trace_mode"] = _mode(value)
        elif mode == "opentelemetry" and name == "resource":
            resource.append(value)
        elif name in _MODE_OPTIONS[mode]:
            fields[_MODE_OPTIONS[mode][name]] = value
        else:
            hint = "" if mode else _HINTS.get(name, "")
            raise ValueError(f"unknown --trace-config setting '{option}'{hint}")
    if levels:
        fields["trace_level"] = ("OFF",) if "OFF" in levels else tuple(dict.fromkeys(levels))
    if resource:
        fields["trace_otel_resource"] = tuple(resource)
    return fields


def _split(option: str) -> tuple[str, str, str]:
    """``(mode, setting, value)``; the mode is "" for a setting of every mode."""
    mode = ""
    rest = option
    comma = option.find(",")
    equals = option.find("=")
    # A comma after the first '=' belongs to the value (opentelemetry,resource=a=b,c).
    if comma == 0:
        raise ValueError(
            "No trace mode specified. --trace-config option format is "
            f"<trace mode>,<setting>=<value> or <setting>=<value>. Got {option}"
        )
    if comma > 0 and (equals < 0 or comma < equals):
        mode = _mode(option[:comma])
        rest = option[comma + 1 :]
    name, equals_sign, value = rest.partition("=")
    if not equals_sign or not name or not value:
        raise ValueError(
            f"--trace-config option format is '<trace mode>,<setting>=<value>'. Got {option}"
        )
    return mode, name, value


def _mode(text: str) -> str:
    mode = text.lower()
    if mode not in _MODES:
        raise ValueError(
            f"invalid value for trace mode option: {text}. "
            'Available options are "triton" and "opentelemetry"'
        )
    return mode


def _level(text: str) -> str:
    try:
        return _LEVELS[text.lower()]
    except KeyError:
        raise ValueError(f"invalid value for trace level option: {text}") from None
