"""One level of load, measured: the loop run with the garbage collector paused and the
client's own CPU counted, on uvloop where it is installed.

``zeroserve bench`` runs its levels through :func:`measure`; code that has its request bytes
ready and wants one level at a time (the scripts under ``bench/``) calls :func:`run_closed`
or :func:`run_open`, each on an event loop of its own:

    plan = LoadPlan(Endpoint("127.0.0.1", 8000), (request,), warmup_s=1, duration_s=5,
                    timeout_s=10, connect_timeout_s=10)
    result = run_open(plan, rate=200.0, seed=1)
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import platform
import resource
import time
from collections.abc import Callable, Coroutine
from importlib import metadata as importlib_metadata
from typing import Any, Protocol, TypeVar

from zeroserve.bench.closed_loop import ClosedLoop, LoadPlan
from zeroserve.bench.open_loop import OpenLoop
from zeroserve.bench.stats import LevelResult

T = TypeVar("T")


class LevelLoop(Protocol):
    """A level's load, HTTP's or gRPC's, run once."""

    async def run(self) -> LevelResult: ...


async def measure(loop: LevelLoop) -> LevelResult:
    """Run ``loop`` (once) and return its result with the client's CPU per wall-clock
    second (this process's, warm-up included)."""
    gc.collect()
    # A collection pause inside the window would show up as server latency.
    gc.disable()
    before = resource.getrusage(resource.RUSAGE_SELF)
    wall = time.perf_counter()
    try:
        result = await loop.run()
    finally:
        gc.enable()
    wall = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return dataclasses.replace(result, client_cpu_cores=cpu_s / wall if wall > 0 else 0.0)


def run_closed(plan: LoadPlan, concurrency: int) -> LevelResult:
    """A closed-loop level: ``concurrency`` connections, each with one request in flight."""
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    return run_on_event_loop(lambda: measure(ClosedLoop(plan, concurrency)))[0]


def run_open(
    plan: LoadPlan, rate: float, *, seed: int = 0, max_connections: int = 512
) -> LevelResult:
    """An open-loop level: Poisson arrivals at ``rate`` per second (the schedule drawn from
    ``seed``), on at most ``max_connections`` connections."""
    if max_connections < 1:
        raise ValueError("max_connections must be >= 1")
    return run_on_event_loop(
        lambda: measure(OpenLoop(plan, rate, seed=seed, max_connections=max_connections))
    )[0]


def run_on_event_loop(main: Callable[[], Coroutine[Any, Any, T]]) -> tuple[T, str]:
    """Run ``main`` on a new event loop, uvloop's where installed; returns its result and
    which loop ran it."""
    try:
        import uvloop
    except ImportError:
        result = asyncio.run(main())
        return result, f"asyncio ({platform.python_implementation()} {platform.python_version()})"
    result = uvloop.run(main())
    version = importlib_metadata.version("uvloop")
    return result, f"uvloop {version} (Python {platform.python_version()})"
