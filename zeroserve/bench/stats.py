"""What a run and each of its levels measured: counts, throughput, latency percentiles and
errors by kind."""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from zeroserve.bench.args import BenchConfig

PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)


@dataclass(frozen=True)
class LatencySummary:
    """Latency of the successful requests of one level, in milliseconds (NaN when none)."""

    count: int
    mean_ms: float
    min_ms: float
    max_ms: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    p999_ms: float

    @classmethod
    def from_ns(cls, values: np.ndarray | array[int] | list[int]) -> LatencySummary:
        ns = np.asarray(values, dtype=np.float64)
        if ns.size == 0:
            nan = math.nan
            return cls(0, nan, nan, nan, nan, nan, nan, nan, nan)
        ms = ns / 1e6
        p50, p90, p95, p99, p999 = (float(v) for v in np.percentile(ms, PERCENTILES))
        return cls(
            count=int(ms.size),
            mean_ms=float(ms.mean()),
            min_ms=float(ms.min()),
            max_ms=float(ms.max()),
            p50_ms=p50,
            p90_ms=p90,
            p95_ms=p95,
            p99_ms=p99,
            p999_ms=p999,
        )


@dataclass(frozen=True)
class StreamSummary:
    """The streams of one level that completed in its timed window."""

    streams: int
    ttft: LatencySummary
    """From the send of the request to the first event carrying text."""
    itl: LatencySummary
    """Gaps between consecutive text events of a stream, all streams pooled."""
    tokens: int
    """Completion tokens of those streams (see ``tokens_from``)."""
    tokens_per_s: float
    """``tokens`` over the timed window: the level's output rate."""
    tokens_from: str
    """``usage`` (the final usage's ``completion_tokens``), ``chunks`` (events carrying
    text), or ``mixed``."""


@dataclass(frozen=True)
class LevelResult:
    """One level (a concurrency or a request rate) over its timed window."""

    mode: str
    """``concurrency`` (closed loop) or ``rate`` (open loop)."""
    level: float
    duration_s: float
    """The timed window."""
    ok: int
    """Successful (2xx) answers counted in the window."""
    errors: dict[str, int]
    """Failed requests in the window by kind (``http_503``, ``connect``, ``timeout``...)."""
    throughput: float
    """Successful answers per second."""
    latency: LatencySummary
    """Closed loop: send to last byte. Open loop: *scheduled* send to last byte."""
    batch_size: int = 1
    service_latency: LatencySummary | None = None
    """Open loop: from the actual send (what a closed-loop tool would report)."""
    offered_rate: float | None = None
    """Open loop: requests per second scheduled in the window."""
    send_lag_p99_ms: float | None = None
    """Open loop: how late the client itself sent (p99), its own share of the latency."""
    connections: int = 0
    """Connections opened during the level."""
    client_cpu_cores: float = 0.0
    """CPU the client process used per wall-clock second over the level (warm-up included)."""
    error_samples: dict[str, str] = field(default_factory=dict)
    """The start of one answer body per error kind, to say why."""
    stream: StreamSummary | None = None
    """``--stream``: time to first token, inter-token latency and tokens per second."""

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    @property
    def inferences_per_s(self) -> float:
        """Throughput in rows: requests per second times the batch size."""
        return self.throughput * self.batch_size

    @property
    def client_cpu_us_per_request(self) -> float | None:
        """The client's CPU per answered request (successes and errors), microseconds."""
        answered = self.ok + self.error_count
        if not answered or self.duration_s <= 0:
            return None
        return self.client_cpu_cores * self.duration_s / answered * 1e6

    @property
    def label(self) -> str:
        if self.mode == "rate":
            return f"rate={self.level:g}/s"
        return f"c={self.level:g}"

    def to_json(self) -> dict[str, Any]:
        document = asdict(self)
        document["error_count"] = self.error_count
        document["inferences_per_s"] = self.inferences_per_s
        document["client_cpu_us_per_request"] = self.client_cpu_us_per_request
        finite: dict[str, Any] = _finite(document)
        return finite


@dataclass
class BenchRun:
    """A run: what was loaded, how, and each level's result (in the order run)."""

    config: BenchConfig
    started_utc: str
    path: str
    request_bytes: int
    distinct_requests: int
    inputs: list[dict[str, Any]]
    client: dict[str, Any]
    levels: list[LevelResult] = field(default_factory=list)

    @property
    def target_description(self) -> str:
        config = self.config
        if config.is_openai:
            kind = "SSE stream" if config.is_stream else "JSON"
            return f"{config.model} at {config.url}{self.path} (OpenAI, {kind})"
        shapes = ", ".join(f"{i['name']} {i['datatype']}{i['shape']}" for i in self.inputs)
        if config.protocol == "grpc":
            kind = "gRPC ModelInfer, raw tensors"
        else:
            kind = "V2, " + ("binary tensors" if config.is_binary else "JSON")
        if config.shared_memory != "none":
            kind += f", {config.shared_memory} shared memory"
        return f"{config.model} at {config.url} ({kind}; {shapes})"

    @property
    def load_description(self) -> str:
        config = self.config
        kind = "closed loop" if config.mode == "concurrency" else "open loop (Poisson)"
        return (
            f"{kind}, {config.duration_s:g} s per level after {config.warmup_s:g} s warm-up, "
            f"batch {config.batch_size}, input data: {config.input_data}, client: "
            f"{self.client['event_loop']}"
        )


def count_errors(kinds: list[str]) -> dict[str, int]:
    """Errors by kind, most frequent first."""
    counts: dict[str, int] = {}
    for kind in kinds:
        counts[kind] = counts.get(kind, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def merge_counts(*parts: Mapping[str, int]) -> dict[str, int]:
    total: dict[str, int] = {}
    for part in parts:
        for kind, count in part.items():
            total[kind] = total.get(kind, 0) + count
    return dict(sorted(total.items(), key=lambda item: (-item[1], item[0])))


def _finite(value: Any) -> Any:
    """NaN and infinities as None: JSON has no NaN."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
