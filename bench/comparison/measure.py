"""One measured point: a load generator against a server, or the engine alone.

The load generator is the same for every server in a run: ``wrk`` (one thread, one
pre-built batch-1 JSON body, closed loop; :func:`wrk_point`) where it is installed, else
``zeroserve bench``, run in this process as a library (closed loop, batch-1 JSON requests,
random inputs from the model's metadata; :func:`served_point`). wrk costs a fraction of
``zeroserve bench``'s CPU per request, which on 2 cores is CPU left to the server under
test, and at low concurrency its own share of each round trip is small enough that latency
is the server's. Around the load the server's whole process tree's CPU is read from
``/proc``, so that a server with worker processes (MLServer's default) is charged for them;
the server's CPU per request is that CPU over the loaded seconds divided by the throughput.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from bench import h2load
from bench.engine import Engine
from bench.loadgen import Target, WrkLoad
from bench.machine import busy_cpu_seconds
from bench.models import RequestBody
from bench.server import process_tree_cpu_seconds
from zeroserve.bench import BenchConfig, BenchError, run_bench


@dataclass(frozen=True)
class LoadSettings:
    """How long each point runs."""

    duration_s: float
    warmup_s: float
    timeout_s: float = 30.0


def bench_command(
    url: str, model: str, concurrency: int, settings: LoadSettings, json_out: Path
) -> list[str]:
    """The ``zeroserve bench`` command line that measures what :func:`served_point` does."""
    return [
        sys.executable,
        "-m",
        "zeroserve.cli",
        "bench",
        url,
        "--model",
        model,
        "--concurrency",
        str(concurrency),
        "--duration",
        f"{settings.duration_s:g}s",
        "--warmup",
        f"{settings.warmup_s:g}s",
        "--timeout",
        f"{settings.timeout_s:g}s",
        "--progress",
        "none",
        "--json",
        str(json_out),
    ]


def served_point(
    url: str,
    model: str,
    concurrency: int,
    settings: LoadSettings,
    server_pid: int,
) -> dict[str, Any]:
    """Run one point of load; its figures, or ``{"failed": why}`` with zero throughput."""
    config = BenchConfig(
        url=url,
        model=model,
        levels=(float(concurrency),),
        duration_s=settings.duration_s,
        warmup_s=settings.warmup_s,
        timeout_s=settings.timeout_s,
        progress="none",
    )
    cpu, busy = process_tree_cpu_seconds(server_pid), busy_cpu_seconds()
    wall = time.monotonic()
    try:
        [level] = run_bench(config).levels
    except BenchError as exc:
        command = bench_command(url, model, concurrency, settings, Path("<out.json>"))
        return _failed(str(exc)[-500:], command)
    wall = time.monotonic() - wall
    cpu, busy = process_tree_cpu_seconds(server_pid) - cpu, busy_cpu_seconds() - busy
    loaded_s = settings.duration_s + settings.warmup_s
    latency = level.latency
    return _record(
        throughput=level.throughput,
        latency_ms=(latency.p50_ms, latency.p90_ms, latency.p99_ms),
        ok=level.ok,
        errors=level.errors,
        error_count=level.error_count,
        error_samples=level.error_samples,
        server_cores=cpu / loaded_s,
        client_cores=level.client_cpu_cores,
        # The rest of the machine over the whole point (its set-up included): noise.
        other_cores=max(busy - cpu - level.client_cpu_cores * loaded_s, 0.0) / wall,
    )


def wrk_point(
    wrk: WrkLoad,
    target: Target,
    body: RequestBody,
    concurrency: int,
    settings: LoadSettings,
    server_pid: int,
) -> dict[str, Any]:
    """One point of wrk load: an untimed warm-up run, then the timed run with the server's
    CPU read around it; its figures, or ``{"failed": why}`` with zero throughput."""
    try:
        if settings.warmup_s > 0:
            wrk.run(
                target, body, connections=concurrency, duration_s=_whole_seconds(settings.warmup_s)
            )
        cpu, busy = process_tree_cpu_seconds(server_pid), busy_cpu_seconds()
        wall = time.monotonic()
        result = wrk.run(
            target, body, connections=concurrency, duration_s=_whole_seconds(settings.duration_s)
        )
        wall = time.monotonic() - wall
        cpu, busy = process_tree_cpu_seconds(server_pid) - cpu, busy_cpu_seconds() - busy
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        return _failed(
            str(exc)[-500:], wrk.command(target, body, connections=concurrency, duration_s=1)
        )
    return _record(
        throughput=result.throughput,
        latency_ms=(result.p50_ms, result.p90_ms, result.p99_ms),
        ok=result.requests,
        errors={kind: count for kind, count in result.errors.items() if count},
        error_count=result.error_count,
        error_samples={},
        server_cores=cpu / wall,
        client_cores=result.client_cpu_cores,
        other_cores=max(busy - cpu - result.client_cpu_cores * wall, 0.0) / wall,
    )


GRPC_STREAMS_PER_CONNECTION: Final = 8
"""As bench/grpc_transports.py: a gRPC client multiplexes calls on few connections."""


def grpc_point(
    executable: str,
    url: str,
    body_file: Path,
    concurrency: int,
    settings: LoadSettings,
    server_pid: int,
    successes: Callable[[], int],
) -> dict[str, Any]:
    """One point of h2load gRPC load (``url``: the ModelInfer method, ``body_file``: one
    framed ModelInferRequest); its figures, or ``{"failed": why}`` with zero throughput.

    h2load cannot read gRPC trailers, so a gRPC error would count as a success: the
    server's own success count (``successes``, read before and after) must cover every
    answer h2load counted, and the shortfall counts as errors."""
    connections, streams = h2load.layout(concurrency, GRPC_STREAMS_PER_CONNECTION)
    log_file = body_file.with_suffix(".log")
    try:
        before = successes()
        cpu, busy = process_tree_cpu_seconds(server_pid), busy_cpu_seconds()
        wall = time.monotonic()
        run = h2load.run(
            executable,
            url,
            body_file,
            h2load.GRPC_HEADERS,
            connections=connections,
            streams=streams,
            duration_s=_whole_seconds(settings.duration_s),
            warmup_s=_whole_seconds(settings.warmup_s),
            log_file=log_file,
        )
        wall = time.monotonic() - wall
        cpu, busy = process_tree_cpu_seconds(server_pid) - cpu, busy_cpu_seconds() - busy
        counted = successes() - before
    except (RuntimeError, subprocess.TimeoutExpired, OSError) as exc:
        return _failed(str(exc)[-500:], [executable, url])
    unconfirmed = max(run.done - run.errors - counted, 0)
    # h2load's rate covers the timed window only; CPU covers the warm-up too, so CPU per
    # request divides by every request the server counted.
    server_cores = cpu / wall
    record = _record(
        throughput=run.requests_per_s,
        latency_ms=(run.p50_ms, run.p90_ms, run.p99_ms),
        ok=run.succeeded - unconfirmed,
        errors={"grpc": run.errors + unconfirmed} if run.errors + unconfirmed else {},
        error_count=run.errors + unconfirmed,
        error_samples={},
        server_cores=server_cores,
        client_cores=run.client_cpu_s / wall,
        other_cores=max(busy - cpu - run.client_cpu_s, 0.0) / wall,
    )
    record["server_cpu_ms_per_request"] = cpu / max(counted, 1) * 1e3
    record["command"] = list(run.command)
    return record


def _whole_seconds(seconds: float) -> int:
    """wrk takes whole seconds."""
    return max(round(seconds), 1)


def _record(
    *,
    throughput: float,
    latency_ms: tuple[float, float, float],
    ok: int,
    errors: dict[str, int],
    error_count: int,
    error_samples: dict[str, str],
    server_cores: float,
    client_cores: float,
    other_cores: float,
) -> dict[str, Any]:
    """One served point's figures, whichever load generator measured them."""
    p50, p90, p99 = latency_ms
    return {
        "throughput": throughput,
        "p50_ms": p50,
        "p90_ms": p90,
        "p99_ms": p99,
        "ok": ok,
        "errors": errors,
        "error_count": error_count,
        "error_samples": error_samples,
        "server_cpu_cores": server_cores,
        "server_cpu_ms_per_request": server_cores / throughput * 1e3 if throughput else None,
        "client_cpu_cores": client_cores,
        "other_cpu_cores": other_cores,
    }


def engine_point(engine: Engine, rows: np.ndarray, settings: LoadSettings) -> dict[str, Any]:
    """The engine alone, ``session.run`` on ``rows`` in a loop in this process."""
    result = engine.measure(rows, duration_s=settings.duration_s, warmup_s=settings.warmup_s)
    return asdict(result) | {"server_cpu_cores": result.cpu_cores}


def _failed(why: str, command: list[str]) -> dict[str, Any]:
    return {"failed": why, "throughput": 0.0, "command": command}
