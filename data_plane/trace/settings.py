"""The start-up trace settings, Triton's ``--trace-config`` values.

Mixed into the data plane's settings (``class DataPlaneSettings(BaseSettings, ServerLimits,
TraceConfig)``), so they are read under its prefix: ``ZEROSERVE_DATA_PLANE_TRACE_FILE``,
``ZEROSERVE_DATA_PLANE_TRACE_LEVEL=TIMESTAMPS`` and so on; `data_plane.trace.options`
reads Triton's ``--trace-config`` options into the same fields. The trace file can only be
set here: Triton refuses to change it through the protocol.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import NoDecode

from data_plane.trace.otel_support import otel_missing_reason
from data_plane.trace.values import INT32_MAX, MIN_TRACE_COUNT, UINT32_MAX, TraceLevel

_LEVEL_NAMES = frozenset({"OFF", "TIMESTAMPS", "TENSORS"})

OTEL_DEFAULT_URL = "http://localhost:4318/v1/traces"
"""Triton's default OTLP/HTTP endpoint (``opentelemetry,url=``)."""


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
    trace_mode: Literal["triton", "opentelemetry"] = "triton"
    """``triton`` writes Triton's trace JSON to :attr:`trace_file`; ``opentelemetry`` sends
    each trace as OpenTelemetry spans over OTLP/HTTP to :attr:`trace_otel_url` (``mode=``;
    needs the ``otel`` extra)."""
    trace_otel_url: str = OTEL_DEFAULT_URL
    """Where spans go in ``opentelemetry`` mode (``opentelemetry,url=``); ``host:port/path``
    without a scheme is taken as ``http://``."""
    trace_otel_resource: Annotated[tuple[str, ...], NoDecode] = ()
    """``key=value`` resource attributes of the spans (``opentelemetry,resource=``, comma
    separated in the environment); ``service.name`` defaults to Triton's
    ``triton-inference-server``."""
    trace_otel_bsp_max_queue_size: int = Field(default=2048, gt=0, le=UINT32_MAX)
    """Spans the batch span processor holds before it drops them (``opentelemetry,
    bsp_max_queue_size=``)."""
    trace_otel_bsp_schedule_delay_ms: int = Field(default=5000, ge=0, le=UINT32_MAX)
    """Milliseconds between two exports (``opentelemetry,bsp_schedule_delay=``)."""
    trace_otel_bsp_max_export_batch_size: int = Field(default=512, gt=0, le=UINT32_MAX)
    """Most spans in one export (``opentelemetry,bsp_max_export_batch_size=``)."""

    @field_validator("trace_level", "trace_otel_resource", mode="before")
    @classmethod
    def _split_lists(cls, value: object) -> object:
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

    @field_validator("trace_otel_resource")
    @classmethod
    def _resource_pairs(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for pair in value:
            key, equals, _ = pair.partition("=")
            if not equals or not key:
                raise ValueError(f"resource attribute '{pair}' is not <key>=<value>")
        return value

    @model_validator(mode="after")
    def _otel_installed(self) -> TraceConfig:
        if self.trace_mode == "opentelemetry":
            reason = otel_missing_reason()
            if reason:
                raise ValueError(reason)
        if self.trace_otel_bsp_max_export_batch_size > self.trace_otel_bsp_max_queue_size:
            raise ValueError(
                "opentelemetry bsp_max_export_batch_size must be at most bsp_max_queue_size"
            )
        return self

    @property
    def start_level(self) -> TraceLevel:
        """The level :attr:`trace_level` names."""
        level = TraceLevel.OFF
        for name in self.trace_level:
            if name != "OFF":
                level |= TraceLevel[name]
        return level
