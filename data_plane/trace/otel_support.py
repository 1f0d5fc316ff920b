"""Whether OpenTelemetry tracing can run here: the ``otel`` extra is optional, so the
settings ask before a server starts in ``opentelemetry`` mode rather than failing later."""

from __future__ import annotations

import importlib

_MODULES = (
    "opentelemetry.sdk.trace",
    "opentelemetry.sdk.trace.export",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
)


def otel_missing_reason() -> str:
    """Why trace mode ``opentelemetry`` cannot run (empty when it can)."""
    for module in _MODULES:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            return (
                "trace mode 'opentelemetry' needs the OpenTelemetry SDK and its OTLP/HTTP "
                f"exporter (pip install 'zeroserve[otel]'): {exc}"
            )
    return ""
