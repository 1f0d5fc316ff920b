"""The start-up trace settings, Triton's ``--trace-config`` values.

Mixed into the data plane's settings (``class DataPlaneSettings(BaseSettings, ServerLimits,
TraceConfig)``), so they are read under its prefix: ``ZEROSERVE_DATA_PLANE_TRACE_FILE``,
``ZEROSERVE_DATA_PLANE_TRACE_LEVEL=TIMESTAMPS`` and so on; :func:`trace_config_overrides`
reads Triton's ``--trace-config`` options into the same fields. The trace file can only be
set here: Triton refuses to change it through the protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import NoDecode

from data_plane.trace.values import INT32_MAX, MIN_TRACE_COUNT, UINT32_MAX, TraceLevel

_LEVEL_NAMES = frozenset({"OFF", "TIMESTAMPS", "TENSORS"})


class TraceConfig(BaseModel):
    """How tracing starts; clients change all but the file at run time."""

    model_config = ConfigDict(frozen=True)

    trace_file: str = ""
    """Where traces go (``triton,file=``); empty: tracing cannot be turned on."""
    trace_level: Annotated[tuple[str, ...], NoDecode] = ("OFF",)
    """``OFF``, ``TIMESTAMPS``, ``TENSORS`` (comma separated in the environment)."""
    trace_rate: int = Field(default=1000, ge=0, le=UINT32_MAX)
    """Every n-th request is traced (``rate=``)."""
    trace_count: int = Field(default=-1, ge=MIN_TRACE_COUNT, le=INT32_MAX)
    """How many requests to trace; -1 has no bound (``count=``)."""
    trace_log_frequency: int = Field(default=0, ge=0, le=UINT32_MAX)
    """Traces per file ``<trace_file>.<n>``; 0 writes them all to ``trace_file`` (``triton,
    log-frequency=``)."""
    trace_buffer_traces: int = Field(default=1000, gt=0)
    """Finished traces held in memory before they go to ``trace_file`` when the log frequency
    is 0 (Triton holds them until the setting changes or the server stops)."""
    trace_writer_queue_bound: int = Field(default=256, gt=0)
    """Writes waiting for the trace file; past it traces are dropped (and logged), so a slow
    disk never holds up requests."""

    @field_validator("trace_level", mode="before")
    @classmethod
    def _split_levels(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("trace_level")
    @classmethod
    def _known_levels(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = sorted(set(value) - _LEVEL_NAMES)
        if unknown:
            raise ValueError(f"unknown trace level(s) {unknown}; use OFF, TIMESTAMPS, TENSORS")
        if "OFF" in value and len(value) > 1:
            raise ValueError("trace level OFF must stand alone")
        return value or ("OFF",)

    @property
    def start_level(self) -> TraceLevel:
        """The level :attr:`trace_level` names."""
        level = TraceLevel.OFF
        for name in self.trace_level:
            if name != "OFF":
                level |= TraceLevel[name]
        return level


_GLOBAL_OPTIONS = {"rate": "trace_rate", "count": "trace_count"}
_TRITON_OPTIONS = {"file": "trace_file", "log-frequency": "trace_log_frequency"}


def trace_config_overrides(options: Sequence[str]) -> dict[str, Any]:
    """:class:`TraceConfig` fields from Triton's ``--trace-config`` options: ``level=<OFF|
    TIMESTAMPS|TENSORS>`` (repeatable), ``rate=<n>``, ``count=<n>``, ``mode=triton``,
    ``triton,file=<path>``, ``triton,log-frequency=<n>``. Values are checked when the
    settings are built; raises ValueError for an option of another form or mode
    (``opentelemetry`` is not supported)."""
    fields: dict[str, Any] = {}
    levels: list[str] = []
    for option in options:
        mode, _, setting = option.rpartition(",")
        name, equals, value = setting.partition("=")
        if not equals or not name:
            raise ValueError(
                f"--trace-config option format is '<trace mode>,<setting>=<value>' or "
                f"'<setting>=<value>', got '{option}'"
            )
        if mode in ("", "triton") and name == "mode":
            if value != "triton":
                raise ValueError(f"trace mode '{value}' is not supported; use triton")
        elif mode == "" and name == "level":
            levels.append(value)
        elif mode == "" and name in _GLOBAL_OPTIONS:
            fields[_GLOBAL_OPTIONS[name]] = value
        elif mode == "triton" and name in _TRITON_OPTIONS:
            fields[_TRITON_OPTIONS[name]] = value
        else:
            raise ValueError(f"unknown --trace-config setting '{option}'")
    if levels:
        fields["trace_level"] = tuple(levels)
    return fields
