"""Triton's request tracing, free of any transport: the settings clients read and change
(server-wide and per model), the sampling of requests, and traces written in Triton's trace
JSON to the trace file, or sent as OpenTelemetry spans.

Modules: `values` (levels, the values of a setting, a requested change, parsing the values
with Triton's texts), `settings` (the start-up configuration), `options` (Triton's
``--trace-config`` options read into it), `setting` (one setting in force: sampling and the
traces it holds), `manager` (the server's settings, per-model overrides, sampling),
`request` (a traced request), `record` (what a trace recorded and its JSON entries),
`writer` (the trace file, written off the event loop), `otel` (traces as OpenTelemetry
spans; imports the optional ``otel`` extra), `otel_support` (whether that extra is here).
"""

from __future__ import annotations

from data_plane.trace.manager import TraceManager
from data_plane.trace.request import RequestTrace
from data_plane.trace.settings import TraceConfig
from data_plane.trace.values import (
    TraceLevel,
    TraceUpdate,
    TraceValues,
    parse_count,
    parse_level,
    parse_log_frequency,
    parse_rate,
)

__all__ = [
    "RequestTrace",
    "TraceConfig",
    "TraceLevel",
    "TraceManager",
    "TraceUpdate",
    "TraceValues",
    "parse_count",
    "parse_level",
    "parse_log_frequency",
    "parse_rate",
]
