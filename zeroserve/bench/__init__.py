"""``zeroserve bench``: a load generator for any KServe V2 (Triton) or OpenAI endpoint, over
HTTP or Triton's gRPC service, with tensors in the requests or in system shared memory.

It measures what a server serves: closed-loop load (N connections, one request each at a
time) and open-loop load (Poisson arrivals at a fixed rate, latency counted from each
request's *scheduled* send time so that a slow server cannot hide its queueing, the
"coordinated omission" of closed-loop tools). Request bodies are built once, before the
clock starts: inputs follow the model's V2 metadata with random data, or come from a
perf_analyzer-style ``--input-data`` file. The client runs on one event loop (uvloop when
installed) over raw keep-alive HTTP/1.1 connections parsed by ``httptools``, so that on a
small machine the server, not the client, is what runs out of CPU. With ``--protocol grpc``
it calls ModelInfer through grpc.aio with pre-serialized messages (no protobuf work per
call), spread over as many HTTP/2 connections as the concurrency needs; with
``--shared-memory system`` the inputs and outputs live in regions the run registers with
the server and unregisters at the end.

It is also the load generator of the benchmarks under ``bench/``, used as a library: a
whole run as the command makes it (:func:`run_bench` with a :class:`BenchConfig`), or one
level of pre-built requests at a time (:func:`run_closed`, :func:`run_open` with a
:class:`LoadPlan` of :func:`http_request` bytes).

Modules: ``args`` (command line), ``inputs`` (metadata, random and file data), ``payload``
(HTTP request bytes), ``client`` (HTTP connections), ``closed_loop``, ``open_loop``,
``grpc_client`` (gRPC targets, channels, setup calls), ``grpc_loops``, ``shared_memory``
(the run's regions), ``http_setup`` and ``grpc_setup`` (requests built and checked),
``prepared``, ``level`` (one level, measured), ``stats``, ``progress``, ``report`` (table and
JSON), ``plot`` (PNG), ``runner`` (the command).
"""

from __future__ import annotations

from zeroserve.bench.args import BenchConfig, add_bench_parser
from zeroserve.bench.client import Endpoint
from zeroserve.bench.closed_loop import LoadPlan
from zeroserve.bench.grpc_client import GrpcTarget, SetupClient, grpc_frame
from zeroserve.bench.grpc_setup import infer_request, shared_memory_request
from zeroserve.bench.inputs import Tensor, TensorSpec
from zeroserve.bench.level import run_closed, run_open
from zeroserve.bench.payload import Body, http_request
from zeroserve.bench.runner import BenchError, run_bench
from zeroserve.bench.shared_memory import SharedMemoryError, SharedMemoryRun
from zeroserve.bench.stats import BenchRun, LatencySummary, LevelResult

__all__ = [
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
]
