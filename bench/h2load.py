"""h2load (nghttp2's HTTP/2 load generator, written in C) as the benchmark's client.

A Python load generator is the bottleneck on a 2-core machine long before a gRPC server
is; h2load sends a pre-encoded request with next to no CPU per request. For gRPC its body
is one length-prefixed ``ModelInferRequest`` (:func:`zeroserve.bench.grpc_frame`) POSTed
to the ModelInfer method with ``content-type: application/grpc`` and ``te: trailers``;
``-c`` connections carrying ``-m`` streams each make the concurrency. With ``--h1`` it
drives HTTP/1.1 (one request in flight per connection) the same way, so both protocols
are loaded by the same client.

h2load counts an HTTP 200 as a success, but a gRPC error also comes as an HTTP 200, its
``grpc-status`` in the trailers: the caller checks a sample call with a real gRPC client
and compares the server's own success count with h2load's (:class:`Run`). Latency comes
from h2load's per-request log (``--log-file``), which holds only the timed window's
requests when a warm-up is given.

Debian ships it as ``nghttp2-client`` (``apt-get install -y nghttp2-client``).
"""

from __future__ import annotations

import re
import resource
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np

_REQUESTS: Final = re.compile(
    r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, "
    r"(\d+) errored, (\d+) timeout"
)
_STATUS: Final = re.compile(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx")
_FINISHED: Final = re.compile(r"finished in ([0-9.]+)(m?s), ([0-9.]+) req/s")
GRPC_HEADERS: Final = ("content-type: application/grpc", "te: trailers")


def find() -> str | None:
    """The h2load executable, or None where it is not installed."""
    return shutil.which("h2load")


def version(executable: str) -> str:
    done = subprocess.run([executable, "--version"], capture_output=True, text=True, timeout=30)
    return done.stdout.strip() or done.stderr.strip()


@dataclass(frozen=True)
class Run:
    """One h2load run's figures over its timed window."""

    requests_per_s: float
    done: int
    succeeded: int
    errors: int
    """Failed, errored and timed-out requests, and answers that were not 2xx."""
    p50_ms: float
    p90_ms: float
    p99_ms: float
    client_cpu_s: float
    """CPU h2load used (warm-up included)."""
    connections: int
    streams: int
    command: tuple[str, ...]


def layout(concurrency: int, streams_per_connection: int) -> tuple[int, int]:
    """(connections, streams per connection) making ``concurrency`` requests in flight:
    ``streams_per_connection`` per connection, fewer when the concurrency is smaller."""
    streams = min(concurrency, streams_per_connection)
    if concurrency % streams:
        raise ValueError(f"concurrency {concurrency} is not a multiple of {streams} streams")
    return concurrency // streams, streams


def run(
    executable: str,
    url: str,
    body: Path,
    headers: Sequence[str],
    *,
    connections: int,
    streams: int,
    duration_s: int,
    warmup_s: int,
    log_file: Path,
    http1: bool = False,
) -> Run:
    """Run h2load once (one thread) and read its summary and per-request log; raises
    RuntimeError with its output if it fails or its output cannot be read."""
    command = [executable, "-t", "1", "-c", str(connections), "-m", str(streams)]
    command += ["-D", str(duration_s), "--warm-up-time", str(warmup_s)]
    command += ["--log-file", str(log_file), "-d", str(body)]
    for header in headers:
        command += ["-H", header]
    if http1:
        command.append("--h1")
    command.append(url)
    log_file.unlink(missing_ok=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=duration_s + warmup_s + 120
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    output = done.stdout + done.stderr
    requests = _REQUESTS.search(output)
    statuses = _STATUS.search(output)
    finished = _FINISHED.search(output)
    if done.returncode != 0 or requests is None or statuses is None or finished is None:
        raise RuntimeError(f"h2load failed ({done.returncode}):\n{output[-3000:]}")
    _, _, answered, succeeded, _, _, _ = (int(v) for v in requests.groups())
    latencies = _latencies_ms(log_file)
    p50, p90, p99 = (float(np.percentile(latencies, q)) for q in (50, 90, 99))
    return Run(
        requests_per_s=float(finished.group(3)),
        done=answered,
        succeeded=succeeded,
        errors=errors_in(output),
        p50_ms=p50,
        p90_ms=p90,
        p99_ms=p99,
        client_cpu_s=(after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        connections=connections,
        streams=streams,
        command=tuple(command),
    )


def errors_in(output: str) -> int:
    """Failed, errored and timed-out requests plus answers read with a status other than 2xx.

    Not ``done`` minus the 2xx count: h2load counts a status and a completion on either side
    of the warm-up's end, so the two differ by one now and then while every answer was 200
    (seen as 2348 done against 2347 2xx, and 2629 against 2630, with no 3xx, 4xx or 5xx).
    Raises ValueError when the summary lines are missing."""
    requests = _REQUESTS.search(output)
    statuses = _STATUS.search(output)
    if requests is None or statuses is None:
        raise ValueError("h2load printed no request or status summary")
    failed, errored, timeouts = (int(v) for v in requests.groups()[4:])
    not_2xx = sum(int(v) for v in statuses.groups()[1:])
    return failed + errored + timeouts + not_2xx


def _latencies_ms(log_file: Path) -> np.ndarray:
    """Each logged request's time to the end of its answer, for those answered 2xx."""
    rows = [line.split("\t") for line in log_file.read_text().splitlines() if line.strip()]
    values = [int(row[2]) / 1000.0 for row in rows if len(row) >= 3 and row[1].startswith("2")]
    if not values:
        raise RuntimeError(f"h2load logged no successful request in {log_file}")
    return np.asarray(values)
