"""``zeroserve bench``: a load generator for any KServe V2 (Triton) or OpenAI endpoint.

It measures what a server serves: closed-loop load (N connections, one request each at a
time) and open-loop load (Poisson arrivals at a fixed rate, latency counted from each
request's *scheduled* send time so that a slow server cannot hide its queueing, the
"coordinated omission" of closed-loop tools). Request bodies are built once, before the
clock starts: inputs follow the model's V2 metadata with random data, or come from a
perf_analyzer-style ``--input-data`` file. The client runs on one event loop (uvloop when
installed) over raw keep-alive HTTP/1.1 connections parsed by ``httptools``, so that on a
small machine the server, not the client, is what runs out of CPU.

It is also the load generator of the benchmarks under ``bench/``, used as a library: a
whole run as the command makes it (:func:`run_bench` with a :class:`BenchConfig`), or one
level of pre-built requests at a time (:func:`run_closed`, :func:`run_open` with a
:class:`LoadPlan` of :func:`http_request` bytes).

Modules: ``args`` (command line), ``inputs`` (metadata, random and file data), ``payload``
(request bytes), ``client`` (connections), ``closed_loop``, ``open_loop``, ``level`` (one
level, measured), ``stats``, ``progress``, ``report`` (table and JSON), ``plot`` (PNG),
``runner`` (the command).
"""

from __future__ import annotations

from zeroserve.bench.args import BenchConfig, add_bench_parser
from zeroserve.bench.client import Endpoint
from zeroserve.bench.closed_loop import LoadPlan
from zeroserve.bench.level import run_closed, run_open
from zeroserve.bench.payload import Body, http_request
from zeroserve.bench.runner import BenchError, run_bench
from zeroserve.bench.stats import BenchRun, LatencySummary, LevelResult

__all__ = [
    "BenchConfig",
    "BenchError",
    "BenchRun",
    "Body",
    "Endpoint",
    "LatencySummary",
    "LevelResult",
    "LoadPlan",
    "add_bench_parser",
    "http_request",
    "run_bench",
    "run_closed",
    "run_open",
]
