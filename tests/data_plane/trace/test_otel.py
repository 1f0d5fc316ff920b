"""Trace mode ``opentelemetry``: each traced request becomes Triton's three spans
(``InferRequest``, the model's, ``compute``) with its timestamps as events, sampled by the
same rate and count as the file mode. The manager's spans are read with the SDK's
in-memory exporter; through the data plane in process they go over real OTLP/HTTP to a
collector on a free loopback port, decoded with OpenTelemetry's own protobuf messages."""

from __future__ import annotations

import contextlib
import gzip
import http.server
import queue
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.sdk.trace", reason="the otel extra is not installed")

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)

from data_plane.trace import TraceConfig, TraceLevel, TraceManager, TraceUpdate
from tests.data_plane.trace.test_http import infer
from tests.data_plane.trace.test_manager import Model, serve
from tests.data_plane.trace.traced_app import traced_data_plane
from tests.models import write_onnx_add_sub

pytestmark = pytest.mark.anyio

MODEL_EVENTS = ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
COMPUTE_EVENTS = ["COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"]


def otel_config(**fields: object) -> TraceConfig:
    return TraceConfig.model_validate(
        {"trace_mode": "opentelemetry", "trace_level": ("TIMESTAMPS",), "trace_rate": 1} | fields
    )


async def spans_of(manager: TraceManager, exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    await manager.close(timeout_s=10.0)
    return list(exporter.get_finished_spans())


async def test_a_request_becomes_tritons_three_spans():
    exporter = InMemorySpanExporter()
    manager = TraceManager(otel_config(), span_exporter=exporter)
    assert manager.settings().mode == "opentelemetry"
    assert serve(manager, Model("simple", version=3), request_id="r-1") == 1
    spans = {span.name: span for span in await spans_of(manager, exporter)}
    assert sorted(spans) == ["InferRequest", "compute", "simple"]
    root, model, compute = spans["InferRequest"], spans["simple"], spans["compute"]

    assert root.parent is None
    assert model.parent is not None and model.parent.span_id == root.context.span_id
    assert compute.parent is not None and compute.parent.span_id == model.context.span_id
    assert len({root.context.trace_id, model.context.trace_id, compute.context.trace_id}) == 1
    assert dict(model.attributes or {}) == {
        "triton.model_name": "simple",
        "triton.model_version": 3,
        "triton.trace_id": 1,
        "triton.trace_parent_id": 0,
        "triton.request_id": "r-1",
    }
    assert [event.name for event in model.events] == MODEL_EVENTS
    assert [event.name for event in compute.events] == COMPUTE_EVENTS
    assert [event.name for event in root.events] == ["INFER_RESPONSE_COMPLETE"]
    # The record's times (REQUEST_START 1000 ns, COMPUTE_START 1030 ... REQUEST_END 1200 on
    # the monotonic clock) keep their order and spacing on the wall clock.
    stamps = sorted([(event.timestamp, event.name) for event in (*model.events, *compute.events)])
    names = [name for _, name in stamps]
    assert names == [*MODEL_EVENTS[:2], *COMPUTE_EVENTS, "REQUEST_END"]
    start = stamps[0][0]
    assert [ns - start for ns, _ in stamps] == [0, 20, 30, 40, 90, 100, 200]
    assert (model.start_time, model.end_time) == (start, start + 200)
    assert (compute.start_time, compute.end_time) == (start + 30, start + 100)
    assert (root.start_time, root.end_time) == (start, start + 200)


async def test_a_failed_request_has_no_compute_span_and_no_request_id_attribute():
    exporter = InMemorySpanExporter()
    manager = TraceManager(otel_config(), span_exporter=exporter)
    trace = manager.sample("m")
    assert trace is not None
    trace.fail(Model("m"), None, request_start_ns=5_000, request_end_ns=9_000)
    spans = {span.name: span for span in await spans_of(manager, exporter)}
    assert sorted(spans) == ["InferRequest", "m"]
    assert [event.name for event in spans["m"].events] == ["REQUEST_START", "REQUEST_END"]
    assert "triton.request_id" not in (spans["m"].attributes or {})


async def test_rate_and_count_sample_as_in_the_file_mode():
    exporter = InMemorySpanExporter()
    manager = TraceManager(otel_config(trace_rate=3), span_exporter=exporter)
    assert serve(manager, Model("m"), 9) == 3
    manager.update("m", TraceUpdate(rate=1, count=2))
    assert serve(manager, Model("m"), 5) == 2
    # A model turned off sends nothing.
    manager.update("off", TraceUpdate(level=TraceLevel.OFF))
    assert serve(manager, Model("off"), 4) == 0
    roots = [span for span in await spans_of(manager, exporter) if span.name == "InferRequest"]
    assert len(roots) == 5


async def test_tensors_alone_send_no_spans():
    """Spans carry timestamps only; at level TENSORS alone there is nothing to send."""
    exporter = InMemorySpanExporter()
    manager = TraceManager(otel_config(trace_level=("TENSORS",)), span_exporter=exporter)
    assert serve(manager, Model("m"), 2) == 2
    assert await spans_of(manager, exporter) == []


async def test_turning_on_needs_no_trace_file():
    manager = TraceManager(otel_config(trace_level=("OFF",)), span_exporter=InMemorySpanExporter())
    assert manager.update(None, TraceUpdate(level=TraceLevel.TIMESTAMPS)).level
    await manager.close(timeout_s=5.0)


class Collector(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP trace receiver: each export's decoded request goes to the server's
    ``exports`` queue."""

    server: CollectorServer

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        self.server.exports.put_nowait((self.path, ExportTraceServiceRequest.FromString(body)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the test reads the exports, not the access log."""


class CollectorServer(http.server.ThreadingHTTPServer):
    exports: queue.Queue[tuple[str, ExportTraceServiceRequest]]


@contextlib.contextmanager
def collector() -> Iterator[CollectorServer]:
    server = CollectorServer(("127.0.0.1", 0), Collector)
    server.exports = queue.Queue(maxsize=100)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


async def test_the_data_plane_sends_spans_over_otlp_http(tmp_path: Path):
    write_onnx_add_sub(tmp_path / "repo", "simple", dims=(4,), max_batch_size=8)
    with collector() as server:
        port = server.server_address[1]
        async with traced_data_plane(
            tmp_path / "repo",
            tmp_path / "cache",
            trace_mode="opentelemetry",
            trace_level=("TIMESTAMPS",),
            trace_rate=2,
            trace_otel_url=f"127.0.0.1:{port}/v1/traces",
            trace_otel_resource=("service.name=zs-test", "test.key=test.value"),
        ) as client:
            setting = (await client.get("/v2/trace/setting")).json()
            assert setting["trace_mode"] == "opentelemetry"
            for n in range(4):
                await infer(client, request_id=f"req-{n}")
        # Leaving the block stopped the server, which sent what its processor held.
        exports = []
        while not server.exports.empty():
            exports.append(server.exports.get_nowait())
    assert exports and {path for path, _ in exports} == {"/v1/traces"}
    spans: list[Span] = []
    for _, request in exports:
        for resource_spans in request.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            assert resource["service.name"] == "zs-test"
            assert resource["test.key"] == "test.value"
            for scope_spans in resource_spans.scope_spans:
                spans.extend(scope_spans.spans)
    names = sorted(span.name for span in spans)
    assert names == ["InferRequest"] * 2 + ["compute"] * 2 + ["simple"] * 2
    model_spans = [span for span in spans if span.name == "simple"]
    request_ids = set()
    for span in model_spans:
        attributes = {a.key: a.value for a in span.attributes}
        assert attributes["triton.model_name"].string_value == "simple"
        assert attributes["triton.model_version"].int_value == 1
        request_ids.add(attributes["triton.request_id"].string_value)
        times = [event.time_unix_nano for event in span.events]
        assert [event.name for event in span.events] == MODEL_EVENTS
        assert times == sorted(times)
        assert span.start_time_unix_nano <= span.end_time_unix_nano
    # Every second request is traced.
    assert request_ids == {"req-1", "req-3"}
