"""The table, the progress lines, the plot and the package's public names."""

from __future__ import annotations

import io

from zeroserve import bench
from zeroserve.bench.args import BenchConfig
from zeroserve.bench.plot import PlotPoint, Series, write_plot
from zeroserve.bench.progress import Progress
from zeroserve.bench.report import table, to_json
from zeroserve.bench.stats import BenchRun, LatencySummary, LevelResult


def _run(mode: str = "concurrency") -> BenchRun:
    level = LevelResult(
        mode=mode,
        level=4.0,
        duration_s=1.0,
        ok=10,
        errors={"http_503": 2, "timeout": 1},
        throughput=10.0,
        latency=LatencySummary.from_ns([1_000_000, 2_000_000, 3_000_000]),
        offered_rate=13.0 if mode == "rate" else None,
        send_lag_p99_ms=0.2 if mode == "rate" else None,
        error_samples={"http_503": '{"error":"queue full"}'},
    )
    config = BenchConfig(url="http://127.0.0.1:1", model="m", mode=mode)  # type: ignore[arg-type]
    return BenchRun(
        config=config,
        started_utc="2026-01-01T00:00:00+00:00",
        path="/v2/models/m/infer",
        request_bytes=100,
        distinct_requests=1,
        inputs=[{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4]}],
        client={"event_loop": "uvloop"},
        levels=[level],
    )


def test_table_lists_levels_errors_and_what_was_measured():
    text = table(_run())
    assert "c=4" in text and "p99 ms" in text
    assert "http_503 2, timeout 1" in text
    assert "queue full" in text
    assert "from the send" in text


def test_open_loop_table_and_json():
    run = _run("rate")
    assert "offered/s" in table(run) and "scheduled" in table(run)
    document = to_json(run)
    assert document["load"]["latency_from"].startswith("scheduled send")
    assert document["levels"][0]["offered_rate"] == 13.0


def test_progress_styles():
    stream = io.StringIO()
    progress = Progress.for_stream(stream, "auto")
    assert progress.style == "plain"
    result = _run().levels[0]
    progress.level_started(0, 1, "c=4", 3.0)
    progress.redraw(_Running())
    progress.level_done(result)
    assert stream.getvalue().splitlines() == [
        "[1/1] c=4: running for 3 s",
        "[1/1] c=4: 10.0/s, p50 2.00 ms, p99 2.98 ms, 3 errors",
    ]
    bar = io.StringIO()
    progress = Progress(bar, "bar")
    progress.level_started(0, 1, "c=4", 3.0)
    progress.redraw(_Running())
    assert bar.getvalue().startswith("\r[1/1] c=4") and "measure" in bar.getvalue()
    silent = io.StringIO()
    Progress(silent, "none").level_done(result)
    assert silent.getvalue() == ""


class _Running:
    answered = 10
    failed = 1
    started_ns = 1
    window_start_ns = 2
    window_end_ns = 10**20


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / "sub" / "plot.png"
    series = [
        Series("a", (PlotPoint(100.0, 1.0, 2.0, "c=1"), PlotPoint(200.0, 2.0, 8.0, "c=8"))),
        Series("empty", ()),
    ]
    write_plot(path, series, title="t", note="n", references=[(300.0, "engine")])
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_public_names():
    assert set(bench.__all__) == {
        "BenchConfig",
        "BenchError",
        "BenchRun",
        "Body",
        "Endpoint",
        "GrpcTarget",
        "LatencySummary",
        "LevelResult",
        "LoadPlan",
        "SetupClient",
        "SharedMemoryError",
        "SharedMemoryRun",
        "Tensor",
        "TensorSpec",
        "add_bench_parser",
        "grpc_frame",
        "http_request",
        "infer_request",
        "run_bench",
        "run_closed",
        "run_open",
        "shared_memory_request",
    }
    for name in bench.__all__:
        assert getattr(bench, name) is not None
