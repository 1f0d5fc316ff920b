"""``zeroserve bench``: prepare the requests, check one, run every level, report.

Everything that costs time per request is settled before the clock starts, by the
protocol's preparation (:mod:`zeroserve.bench.http_setup`, :mod:`zeroserve.bench.grpc_setup`):
the model's metadata gives the inputs, the request bytes are built, shared-memory regions
are registered where asked, and one request is sent and its answer checked, so that a wrong
model name or input fails at once with the server's own message instead of as a table of
errors. Then each level runs on one event loop (uvloop when installed) with the garbage
collector paused (:mod:`zeroserve.bench.level`); the regions are unregistered at the end,
however the run ends.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TextIO

from foundation.output import emit
from zeroserve.bench import report
from zeroserve.bench.args import BenchConfig, config_from_args
from zeroserve.bench.closed_loop import ClosedLoop
from zeroserve.bench.grpc_loops import GrpcClosedLoop, GrpcLoadPlan, GrpcOpenLoop
from zeroserve.bench.grpc_setup import prepare_grpc
from zeroserve.bench.http_setup import prepare_http
from zeroserve.bench.level import measure, run_on_event_loop
from zeroserve.bench.open_loop import OpenLoop
from zeroserve.bench.plot import PlotUnavailableError
from zeroserve.bench.prepared import BenchError, Prepared
from zeroserve.bench.progress import REDRAW_S, Progress, RunningLevel
from zeroserve.bench.stats import BenchRun, LevelResult

__all__ = ["BenchError", "main", "run_bench"]


def run_bench(
    config: BenchConfig,
    *,
    err: TextIO | None = None,
    on_level: Callable[[LevelResult], None] | None = None,
) -> BenchRun:
    """Run every level of ``config`` against its server; raises :class:`BenchError`."""
    started_utc = datetime.now(UTC).isoformat(timespec="seconds")
    prepared = prepare_grpc(config) if config.protocol == "grpc" else prepare_http(config)
    try:
        return _run_levels(config, prepared, started_utc, err, on_level)
    finally:
        prepared.close()


def _run_levels(
    config: BenchConfig,
    prepared: Prepared,
    started_utc: str,
    err: TextIO | None,
    on_level: Callable[[LevelResult], None] | None,
) -> BenchRun:
    run = BenchRun(
        config=config,
        started_utc=started_utc,
        path=prepared.path,
        request_bytes=prepared.request_bytes,
        distinct_requests=len(prepared.plan.requests),
        inputs=prepared.inputs,
        client=_client_description(),
    )
    progress = Progress.for_stream(err or sys.stderr, config.progress)

    async def levels() -> None:
        for index, level in enumerate(config.levels):
            label = f"rate={level:g}/s" if config.mode == "rate" else f"c={level:g}"
            progress.level_started(
                index, len(config.levels), label, config.warmup_s + config.duration_s
            )
            loop = _loop(config, prepared, level, index)
            result = await _run_level(loop, progress)
            progress.level_done(result)
            run.levels.append(result)
            if on_level is not None:
                on_level(result)

    _, run.client["event_loop"] = run_on_event_loop(levels)
    return run


def _loop(
    config: BenchConfig, prepared: Prepared, level: float, index: int
) -> ClosedLoop | OpenLoop | GrpcClosedLoop | GrpcOpenLoop:
    plan = prepared.plan
    # A different seed per level, the same ones every run with the same --seed.
    seed = config.seed * 1_000_003 + index
    if isinstance(plan, GrpcLoadPlan):
        if config.mode == "rate":
            return GrpcOpenLoop(plan, level, seed=seed, max_in_flight=config.max_connections)
        return GrpcClosedLoop(plan, int(level))
    if config.mode == "rate":
        return OpenLoop(plan, level, seed=seed, max_connections=config.max_connections)
    return ClosedLoop(plan, int(level))


async def _run_level(
    loop: ClosedLoop | OpenLoop | GrpcClosedLoop | GrpcOpenLoop, progress: Progress
) -> LevelResult:
    redraw = asyncio.create_task(_redraw(progress, loop), name="bench-progress")
    try:
        return await measure(loop)
    finally:
        redraw.cancel()
        await asyncio.gather(redraw, return_exceptions=True)


async def _redraw(progress: Progress, loop: RunningLevel) -> None:
    if progress.style != "bar":
        return
    while True:
        await asyncio.sleep(REDRAW_S)
        progress.redraw(loop)


def _client_description() -> dict[str, Any]:
    return {
        "event_loop": "",
        "python": platform.python_version(),
        "pid": os.getpid(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "load_average": list(os.getloadavg()),
    }


# -- the command -----------------------------------------------------------------------------


def main(args: argparse.Namespace) -> int:
    """``zeroserve bench``: 0 when every level served, 1 when a level got no answer, 2 when
    the run could not start."""
    try:
        config = config_from_args(args, tuple(sys.argv))
    except ValueError as exc:
        print(f"zeroserve bench: {exc}", file=sys.stderr)
        return 2
    try:
        run = run_bench(config)
    except BenchError as exc:
        print(f"zeroserve bench: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("zeroserve bench: interrupted", file=sys.stderr)
        return 130
    output = getattr(args, "output", "table")
    if output == "table":
        print(report.table(run))
    else:
        emit(report.to_json(run), (), output)
    # With json or yaml on stdout, what else is said goes to stderr, so stdout parses.
    notes = sys.stdout if output == "table" else sys.stderr
    if config.json_out is not None:
        report.write_json(config.json_out, report.to_json(run))
        print(f"results: {config.json_out}", file=notes)
    if config.plot_out is not None:
        try:
            report.plot_run(run, config.plot_out)
        except PlotUnavailableError as exc:
            print(f"zeroserve bench: {exc}", file=sys.stderr)
            return 2
        print(f"plot: {config.plot_out}", file=notes)
    return 1 if any(r.ok == 0 for r in run.levels) else 0
