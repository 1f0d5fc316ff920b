"""``zeroserve bench``: a load generator for any KServe V2 (Triton) or OpenAI endpoint.

It measures what a server serves: closed-loop load (N connections, one request each at a
time) and open-loop load (Poisson arrivals at a fixed rate, latency counted from each
request's *scheduled* send time so that a slow server cannot hide its queueing, the
"coordinated omission" of closed-loop tools). Request bodies are built once, before the
clock starts: inputs follow the model's V2 metadata with random data, or come from a
perf_analyzer-style ``--input-data`` file. The client runs on one event loop (uvloop when
installed) over raw keep-alive HTTP/1.1 connections parsed by ``httptools``, so that on a
small machine the server, not the client, is what runs out of CPU.

Modules: ``args`` (command line), ``inputs`` (metadata, random and file data), ``payload``
(request bytes), ``client`` (connections), ``closed_loop``, ``open_loop``, ``stats``,
``progress``, ``report`` (table and JSON), ``plot`` (PNG), ``runner`` (the command).
"""

from __future__ import annotations

from zeroserve.bench.args import BenchConfig, add_bench_parser
from zeroserve.bench.runner import BenchError, run_bench
from zeroserve.bench.stats import BenchRun, LatencySummary, LevelResult

__all__ = [
    "BenchConfig",
    "BenchError",
    "BenchRun",
    "LatencySummary",
    "LevelResult",
    "add_bench_parser",
    "run_bench",
]
