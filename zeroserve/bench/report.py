"""The end-of-run table, the JSON document and the plot of one ``zeroserve bench`` run."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from zeroserve.bench.plot import PlotPoint, Series, write_plot
from zeroserve.bench.stats import BenchRun, LevelResult, merge_counts


def table(run: BenchRun) -> str:
    """One row per level, then errors by kind and what the figures mean."""
    config = run.config
    is_open = config.mode == "rate"
    unit = "infer/s" if config.batch_size > 1 else "req/s"
    header = f"{'level':<14}{unit:>11}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'max ms':>9}"
    if is_open:
        header += f"{'offered/s':>10}{'lag p99':>9}"
    header += f"{'errors':>8}{'cli cpu':>8}{'us/req':>8}"
    lines = [
        f"{run.target_description}",
        f"{run.load_description}",
        "",
        header,
        "-" * len(header),
    ]
    for result in run.levels:
        throughput = result.inferences_per_s if config.batch_size > 1 else result.throughput
        latency = result.latency
        row = (
            f"{result.label:<14}{throughput:>11,.1f}{_ms(latency.p50_ms)}{_ms(latency.p90_ms)}"
            f"{_ms(latency.p99_ms)}{_ms(latency.max_ms)}"
        )
        if is_open:
            row += f"{_num(result.offered_rate, '>10,.1f')}{_ms(result.send_lag_p99_ms)}"
        row += (
            f"{result.error_count:>8,}{result.client_cpu_cores:>8.2f}"
            f"{_num(result.client_cpu_us_per_request, '>8.0f')}"
        )
        lines.append(row)
    if config.is_stream:
        lines += ["", *_stream_rows(run)]
    errors = merge_counts(*(r.errors for r in run.levels))
    if errors:
        lines += ["", "errors by kind:"]
        for result in run.levels:
            if result.errors:
                parts = ", ".join(f"{kind} {count:,}" for kind, count in result.errors.items())
                lines.append(f"  {result.label}: {parts}")
        samples: dict[str, str] = {}
        for result in run.levels:
            for kind, sample in result.error_samples.items():
                samples.setdefault(kind, sample)
        for kind, sample in samples.items():
            lines.append(f"  {kind} answer: {sample.strip()[:200]}")
    lines += ["", _legend(run)]
    return "\n".join(lines)


def to_json(run: BenchRun) -> dict[str, Any]:
    """The run as a JSON-ready document (NaN as null)."""
    config = run.config
    return {
        "tool": "zeroserve bench",
        "started_utc": run.started_utc,
        "command": list(config.argv),
        "target": {
            "url": config.url,
            "model": config.model,
            "model_version": config.model_version,
            "protocol": "openai" if config.is_openai else "v2",
            "transport": config.protocol,
            "shared_memory": config.shared_memory,
            "stream": config.is_stream,
            "path": run.path,
            "encoding": _encoding(run),
            "request_bytes": run.request_bytes,
            "distinct_requests": run.distinct_requests,
        },
        "inputs": run.inputs,
        "load": {
            "mode": config.mode,
            "levels": list(config.levels),
            "duration_s": config.duration_s,
            "warmup_s": config.warmup_s,
            "batch_size": config.batch_size,
            "input_data": config.input_data,
            "timeout_s": config.timeout_s,
            "seed": config.seed,
            "max_connections": config.max_connections if config.mode == "rate" else None,
            "streams_per_connection": (
                config.streams_per_connection if config.protocol == "grpc" else None
            ),
            "latency_from": _latency_from(run),
        },
        "client": run.client,
        "levels": [r.to_json() for r in run.levels],
    }


def _stream_rows(run: BenchRun) -> list[str]:
    """TTFT, ITL and tokens/s per level, for ``--stream``."""
    header = (
        f"{'level':<14}{'ttft p50':>9}{'ttft p90':>9}{'ttft p99':>9}"
        f"{'itl p50':>9}{'itl p90':>9}{'itl p99':>9}{'tok/s':>10}{'tokens':>9}"
    )
    lines = [header, "-" * len(header)]
    for result in run.levels:
        stream = result.stream
        if stream is None:
            continue
        ttft, itl = stream.ttft, stream.itl
        lines.append(
            f"{result.label:<14}{_ms(ttft.p50_ms)}{_ms(ttft.p90_ms)}{_ms(ttft.p99_ms)}"
            f"{_ms(itl.p50_ms)}{_ms(itl.p90_ms)}{_ms(itl.p99_ms)}"
            f"{stream.tokens_per_s:>10,.1f}{stream.tokens:>9,}"
        )
    return lines


def write_json(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")


def plot_run(run: BenchRun, path: Path) -> None:
    """Latency against throughput for the run's levels."""
    write_plot(
        path,
        [series_of(run.config.model, run.levels)],
        title=f"zeroserve bench: {run.target_description}",
        note=run.load_description,
    )


def series_of(name: str, levels: Sequence[LevelResult]) -> Series:
    """One plot line through ``levels``."""
    return Series(
        name,
        tuple(PlotPoint(r.throughput, r.latency.p50_ms, r.latency.p99_ms, r.label) for r in levels),
    )


def _encoding(run: BenchRun) -> str:
    config = run.config
    if config.shared_memory != "none":
        return "shared_memory"
    if config.protocol == "grpc":
        return "raw"
    return "binary" if config.is_binary else "json"


def _latency_from(run: BenchRun) -> str:
    if run.config.mode == "rate":
        return "scheduled send time (Poisson arrivals), to the last byte of the answer"
    return "send of the request, to the last byte of the answer"


def _legend(run: BenchRun) -> str:
    config = run.config
    window = f"{config.duration_s:g} s timed after {config.warmup_s:g} s of warm-up, one run"
    if config.mode == "rate":
        what = (
            "open loop: latency from each request's scheduled (Poisson) send time to its "
            "answer's last byte; offered/s: requests scheduled per second; lag p99: how late "
            "the client itself sent"
        )
    else:
        what = "closed loop: latency from the send to the answer's last byte"
    if config.protocol == "grpc":
        what += (
            f" (gRPC: at most {config.streams_per_connection} calls per connection; "
            "errors by status code)"
        )
    legend = (
        f"Each row: {window} per level. {what}; throughput counts successful (2xx, or gRPC OK) "
        "answers completed in the window; cli cpu: cores this client used; us/req: its CPU "
        "per answered request."
    )
    if config.is_stream:
        sources = {r.stream.tokens_from for r in run.levels if r.stream is not None}
        counted = (
            "the final usage's completion_tokens"
            if sources == {"usage"}
            else "events carrying text (one per token)"
            if sources == {"chunks"}
            else "usage where sent, else events carrying text"
        )
        legend += (
            " Streams (ms): ttft from the send to the first data: event carrying text; itl: "
            "gaps between later text events; tok/s: tokens of the streams completed in the "
            f"window per second, counted from {counted}; a stream without data: [DONE] or "
            "with an error event is a 'stream' error."
        )
    return legend


def _ms(value: float | None) -> str:
    return _num(value, ">9.2f")


def _num(value: float | None, spec: str) -> str:
    width = int("".join(c for c in spec.split(".")[0] if c.isdigit()) or 0)
    if value is None or not math.isfinite(value):
        return f"{'-':>{width}}"
    return format(value, spec)
