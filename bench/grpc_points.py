"""The gRPC benchmark's measured points, their medians, the tables and the targets.

A point is one load run of one contender at one concurrency: h2load's (or zeroserve
bench's) throughput and latency, with what the server itself counted, the CPU the server
and the client used per request, and the load average when it ended (the machine is shared).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from bench import h2load, machine, report
from bench.grpc_contenders import (
    GRPC_ECHO,
    TRITON_PYTHON,
    ZS_GRPC,
    ZS_GRPC_SHM,
    ZS_HTTP,
    ZS_PYTHON,
    ZS_PYTHON_INPROCESS,
    Contender,
    Servers,
)
from bench.server import REPO_ROOT, process_tree_cpu_seconds
from zeroserve.bench import BenchConfig, run_bench

FIGURES: Final = ("infer_per_s", "p50_ms", "p90_ms", "p99_ms")


@dataclass(frozen=True)
class Point:
    """One run of one contender at one concurrency."""

    contender: str
    concurrency: int
    repeat: int
    infer_per_s: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    errors: int
    """Failed requests, as the client counted them, plus answers the server did not count
    as successes (a gRPC error h2load took for a success)."""
    answered: int
    server_successes: int
    """The server's own success count over the run (warm-up included)."""
    server_cpu_us: float
    """CPU of the server's processes per request, warm-up included."""
    client_cpu_us: float
    load_average: float
    """The 1-minute load average at the end of the run."""
    client: str
    connections: int
    streams: int

    def line(self) -> str:
        return (
            f"repeat {self.repeat} c={self.concurrency:<3} {self.contender:<20} "
            f"{self.infer_per_s:9,.0f} infer/s  p50 {self.p50_ms:6.2f} ms  p99 "
            f"{self.p99_ms:7.2f} ms  errors {self.errors}  server {self.server_cpu_us:4.0f} "
            f"us/req  load {self.load_average:.1f}"
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def measure(
    servers: Servers,
    contender: Contender,
    concurrency: int,
    repeat: int,
    args: argparse.Namespace,
    client: str | None,
) -> Point:
    """One run (h2load where ``client`` names it, else zeroserve bench in process)."""
    pid = servers.pids[contender.server]
    before = servers.successes(contender)
    cpu_before = process_tree_cpu_seconds(pid)
    if client is not None:
        figures = _h2load(servers, contender, concurrency, args, client)
    else:
        figures = _zeroserve_bench(servers, contender, concurrency, args)
    cpu = process_tree_cpu_seconds(pid) - cpu_before
    counted = servers.successes(contender) - before
    answered = int(figures["answered"])
    # h2load reads HTTP statuses itself, but not gRPC's (in trailers): only gRPC answers
    # need the server's own count behind them. (For HTTP that count, read as h2load ends,
    # once came out one short under load while every status h2load read was 200.)
    unconfirmed = 0
    if contender.protocol != "http" or client is None:
        unconfirmed = max(answered - int(figures["errors"]) - counted, 0)
    return Point(
        contender=contender.key,
        concurrency=concurrency,
        repeat=repeat,
        infer_per_s=round(float(figures["infer_per_s"]), 1),
        p50_ms=round(float(figures["p50_ms"]), 3),
        p90_ms=round(float(figures["p90_ms"]), 3),
        p99_ms=round(float(figures["p99_ms"]), 3),
        errors=int(figures["errors"]) + unconfirmed,
        answered=answered,
        server_successes=counted,
        server_cpu_us=round(cpu / max(counted, 1) * 1e6, 1),
        client_cpu_us=round(float(figures["client_cpu_s"]) / max(answered, 1) * 1e6, 1),
        load_average=machine.load_average()[0],
        client=str(figures["client"]),
        connections=int(figures["connections"]),
        streams=int(figures["streams"]),
    )


def _h2load(
    servers: Servers,
    contender: Contender,
    concurrency: int,
    args: argparse.Namespace,
    executable: str,
) -> dict[str, float | str]:
    if contender.protocol == "http":
        connections, streams = concurrency, 1
    else:
        connections, streams = h2load.layout(concurrency, args.streams_per_connection)
    run = h2load.run(
        executable,
        servers.url(contender),
        servers.files[contender.key],
        servers.headers(contender),
        connections=connections,
        streams=streams,
        duration_s=args.duration_s,
        warmup_s=args.warmup_s,
        log_file=servers.workdir / "h2load.log",
        http1=contender.protocol == "http",
    )
    return {
        "infer_per_s": run.requests_per_s,
        "p50_ms": run.p50_ms,
        "p90_ms": run.p90_ms,
        "p99_ms": run.p99_ms,
        "answered": run.done,
        "errors": run.errors,
        "client_cpu_s": run.client_cpu_s,
        "client": "h2load",
        "connections": connections,
        "streams": streams,
    }


def _zeroserve_bench(
    servers: Servers, contender: Contender, concurrency: int, args: argparse.Namespace
) -> dict[str, float | str]:
    if contender.protocol == "http":
        url = f"http://127.0.0.1:{servers.http_port}"
    else:
        url = servers.grpc_addresses[contender.server]
    config = BenchConfig(
        url=url,
        model=contender.model,
        protocol=contender.protocol,
        shared_memory="system" if contender.is_shared_memory else "none",
        is_binary=contender.protocol == "http",
        levels=(float(concurrency),),
        duration_s=float(args.duration_s),
        warmup_s=float(args.warmup_s),
        streams_per_connection=args.streams_per_connection,
        progress="none",
    )
    (result,) = run_bench(config).levels
    return {
        "infer_per_s": result.throughput,
        "p50_ms": result.latency.p50_ms,
        "p90_ms": result.latency.p90_ms,
        "p99_ms": result.latency.p99_ms,
        "answered": result.ok + result.error_count,
        "errors": result.error_count,
        "client_cpu_s": result.client_cpu_cores * (args.duration_s + args.warmup_s),
        "client": "zeroserve bench",
        "connections": result.connections,
        "streams": args.streams_per_connection if contender.protocol == "grpc" else 1,
    }


def summary(points: Sequence[Point]) -> dict[str, Any]:
    """Medians over the repeats: ``{contender: {concurrency: {figure: median}}}``."""
    medians: dict[str, Any] = {}
    for key in dict.fromkeys(p.contender for p in points):
        mine = [p for p in points if p.contender == key]
        medians[key] = {}
        for c in dict.fromkeys(p.concurrency for p in mine):
            runs = [p for p in mine if p.concurrency == c]
            entry = {f: round(statistics.median(getattr(p, f) for p in runs), 3) for f in FIGURES}
            entry["server_cpu_us"] = round(statistics.median(p.server_cpu_us for p in runs), 1)
            entry["errors"] = sum(p.errors for p in runs)
            entry["load_average"] = [p.load_average for p in runs]
            medians[key][str(c)] = entry
    return medians


def _cell(medians: dict[str, Any], contender: Contender, c: int, figure: str) -> float | None:
    entry = medians.get(contender.key, {}).get(str(c))
    return None if entry is None else float(entry[figure])


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}"


def tables(medians: dict[str, Any], concurrency: Sequence[int], *, has_triton: bool) -> str:
    """The two markdown tables: transports, and zeroserve against Triton."""
    rows = [
        "Transports (light MLP, ONNX Runtime; infer/s, p50 / p99 ms):",
        "",
        "| c | HTTP/1.1 binary | gRPC | gRPC + system shared memory | gRPC ÷ HTTP "
        "| grpc.aio echo, no inference |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for c in concurrency:
        cells = []
        for contender in (ZS_HTTP, ZS_GRPC, ZS_GRPC_SHM):
            rate = _cell(medians, contender, c, "infer_per_s")
            p50 = _cell(medians, contender, c, "p50_ms")
            p99 = _cell(medians, contender, c, "p99_ms")
            latency = "" if p50 is None or p99 is None else f" ({p50:.2f} / {p99:.2f})"
            cells.append(_rate(rate) + latency)
        ratio = _ratio(
            _cell(medians, ZS_GRPC, c, "infer_per_s"), _cell(medians, ZS_HTTP, c, "infer_per_s")
        )
        echo = _rate(_cell(medians, GRPC_ECHO, c, "infer_per_s"))
        rows.append(f"| {c} | {' | '.join(cells)} | {ratio} | {echo} |")
    rows += [
        "",
        "The same model.py (ONNX Runtime inside) over gRPC, infer/s:",
        "",
        "| c | zeroserve, Triton's contract | zeroserve, in process | Triton 2.51 | "
        "contract ÷ Triton | in process ÷ Triton |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for c in concurrency:
        ours = _cell(medians, ZS_PYTHON, c, "infer_per_s")
        inprocess = _cell(medians, ZS_PYTHON_INPROCESS, c, "infer_per_s")
        triton = _cell(medians, TRITON_PYTHON, c, "infer_per_s") if has_triton else None
        rows.append(
            f"| {c} | {_rate(ours)} | {_rate(inprocess)} | {_rate(triton)} | "
            f"{_ratio(ours, triton)} | {_ratio(inprocess, triton)} |"
        )
    return "\n".join(rows)


def targets(medians: dict[str, Any], concurrency: Sequence[int]) -> dict[str, Any]:
    """zeroserve's gRPC at least real Triton's at every concurrency (each zeroserve contract
    judged apart), as far as Triton ran."""
    judged: dict[str, Any] = {"lines": []}
    for contender in (ZS_PYTHON, ZS_PYTHON_INPROCESS):
        ratios = {}
        for c in concurrency:
            ours = _cell(medians, contender, c, "infer_per_s")
            triton = _cell(medians, TRITON_PYTHON, c, "infer_per_s")
            if ours is not None and triton:
                ratios[str(c)] = round(ours / triton, 3)
        met = bool(ratios) and all(r >= 1.0 for r in ratios.values())
        judged[contender.key] = {"ratio_to_triton": ratios, "met": met}
        verdict = "met" if met else ("not run" if not ratios else "MISSED")
        judged["lines"].append(
            f"target: {contender.label} >= Triton at every concurrency: {verdict} {ratios}"
        )
    judged["load_average_at_end"] = list(os.getloadavg())
    return judged


def save_results(
    args: argparse.Namespace,
    started_utc: datetime,
    benchmark: str,
    module: str,
    contenders: Sequence[Contender],
    client_name: str,
    points: Sequence[Point],
    medians: dict[str, Any],
    text: str,
    extra: dict[str, Any],
) -> Path:
    """Writes a gRPC benchmark's run to ``bench/results/<UTC time>-<tag>-<benchmark>.json``
    (the settings, contenders, machine, points, medians and table, then ``extra``'s keys);
    the path. ``args`` is the benchmark's parsed command line, ``module`` the one it runs
    as (``bench.grpc_transports``)."""
    stamp = started_utc.strftime("%Y-%m-%dT%H%M%SZ")
    tag = re.sub(r"[^A-Za-z0-9_.-]+", "-", args.tag or socket.gethostname()).strip("-") or "host"
    document: dict[str, Any] = {
        "benchmark": benchmark,
        "started_utc": started_utc.isoformat(),
        "command": ["python", "-m", module, *sys.argv[1:]],
        "settings": {
            "concurrency": args.concurrency,
            "repeats": args.repeats,
            "duration_s": args.duration_s,
            "warmup_s": args.warmup_s,
            "streams_per_connection": args.streams_per_connection,
        },
        "contenders": {c.key: c.describe() for c in contenders},
        "machine": machine.describe(REPO_ROOT, load_generator=client_name),
        "points": [p.to_json() for p in points],
        "medians": medians,
        "table": text,
        **extra,
    }
    path = REPO_ROOT / "bench" / "results" / f"{stamp}-{tag}-{benchmark}.json"
    report.write_json(path, document)
    return path
