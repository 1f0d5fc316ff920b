"""Traces as OpenTelemetry spans (trace mode ``opentelemetry``), shaped as Triton's
OpenTelemetry mode shapes them: per traced request a top-level ``InferRequest`` span; under
it a span named after the model, with the events ``REQUEST_START``, ``QUEUE_START``,
``REQUEST_END`` and the attributes ``triton.model_name``, ``triton.model_version``,
``triton.trace_id``, ``triton.trace_parent_id`` and ``triton.request_id`` (when the request
has an id); under that a ``compute`` span with ``COMPUTE_START``, ``COMPUTE_INPUT_END``,
``COMPUTE_OUTPUT_START``, ``COMPUTE_END`` (none for a request answered from the response
cache or failed before it ran).

Spans are built on the trace writer's thread from the finished record, with the record's
times (monotonic) moved onto the wall clock OpenTelemetry reads, and go out through a batch
span processor, by default to an OTLP/HTTP exporter. Imports the ``otel`` extra: load this
module only in that mode (:func:`~data_plane.trace.otel_support.otel_missing_reason` first).
"""

from __future__ import annotations

import asyncio
import logging
import time

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

from data_plane.trace.record import (
    COMPUTE_END,
    COMPUTE_START,
    REQUEST_END,
    REQUEST_START,
    TraceRecord,
)
from data_plane.trace.settings import TraceConfig
from data_plane.trace.writer import TraceWriter

logger = logging.getLogger(__name__)

ROOT_SPAN = "InferRequest"
COMPUTE_SPAN = "compute"
RESPONSE_COMPLETE = "INFER_RESPONSE_COMPLETE"
SERVICE_NAME = "triton-inference-server"
"""Triton's default ``service.name``."""

_COMPUTE_EVENTS = frozenset(
    {COMPUTE_START, "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", COMPUTE_END}
)
_EXPORT_TIMEOUT_S = 10.0


class OtelSpans:
    """Sends finished traces as spans; :meth:`export` never blocks the caller."""

    def __init__(
        self, config: TraceConfig, writer: TraceWriter, *, exporter: SpanExporter | None = None
    ) -> None:
        attributes = {"service.name": SERVICE_NAME}
        for pair in config.trace_otel_resource:
            key, _, value = pair.partition("=")
            attributes[key] = value
        self._provider = TracerProvider(resource=Resource.create(attributes))
        self._provider.add_span_processor(
            BatchSpanProcessor(
                exporter or OTLPSpanExporter(endpoint=url(config), timeout=_EXPORT_TIMEOUT_S),
                max_queue_size=config.trace_otel_bsp_max_queue_size,
                schedule_delay_millis=config.trace_otel_bsp_schedule_delay_ms,
                max_export_batch_size=config.trace_otel_bsp_max_export_batch_size,
            )
        )
        self._tracer = self._provider.get_tracer("zeroserve")
        self._writer = writer
        # Triton's OpenTelemetry mode moves its steady-clock times onto the system clock by
        # an offset taken once, as here.
        self._wall_offset_ns = time.time_ns() - time.monotonic_ns()

    def export(self, record: TraceRecord) -> None:
        """Send ``record``'s spans (nothing when it holds no timestamps)."""
        if record.timestamps:
            self._writer.submit(lambda: self._spans(record), f"the spans of trace {record.id}")

    async def close(self, *, timeout_s: float) -> None:
        """Send what the processor holds and stop it, waiting up to ``timeout_s``."""
        try:
            await asyncio.wait_for(asyncio.to_thread(self._provider.shutdown), timeout_s)
        except TimeoutError:
            logger.error("OpenTelemetry spans not sent within %s s; some are lost", timeout_s)

    def _spans(self, record: TraceRecord) -> None:
        stamps = [(name, ns + self._wall_offset_ns) for name, ns in record.timestamps]
        times = dict(stamps)
        start, end = stamps[0][1], stamps[-1][1]
        root = self._tracer.start_span(ROOT_SPAN, start_time=times.get(REQUEST_START, start))
        attributes: dict[str, str | int] = {
            "triton.model_name": record.model_name,
            "triton.model_version": record.model_version,
            "triton.trace_id": record.id,
            "triton.trace_parent_id": 0,
        }
        if record.request_id:
            attributes["triton.request_id"] = record.request_id
        model = self._tracer.start_span(
            record.model_name,
            context=trace.set_span_in_context(root),
            start_time=times.get(REQUEST_START, start),
            attributes=attributes,
        )
        compute = None
        if COMPUTE_START in times:
            compute = self._tracer.start_span(
                COMPUTE_SPAN,
                context=trace.set_span_in_context(model),
                start_time=times[COMPUTE_START],
            )
        for name, ns in stamps:
            span = compute if compute is not None and name in _COMPUTE_EVENTS else model
            span.add_event(name, timestamp=ns)
        if compute is not None:
            compute.end(end_time=times.get(COMPUTE_END, end))
        model.end(end_time=times.get(REQUEST_END, end))
        root.add_event(RESPONSE_COMPLETE, timestamp=times.get(REQUEST_END, end))
        root.end(end_time=times.get(REQUEST_END, end))


def url(config: TraceConfig) -> str:
    """The exporter's endpoint: Triton takes ``host:port/path``, OTLP wants a URL."""
    endpoint = config.trace_otel_url
    return endpoint if "://" in endpoint else f"http://{endpoint}"
