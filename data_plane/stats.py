"""Per-model-version statistics in Triton's shape, read by ``/stats`` and ``/metrics``."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Duration:
    """A count and a total in nanoseconds, Triton's ``{"count": n, "ns": t}``."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def to_json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass(slots=True)
class BatchSizeStats:
    """Execution timings for one batch size."""

    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass(slots=True)
class ComputeTimes:
    """Compute durations added up over several requests: an ensemble's steps, whose sums
    Triton reports as the ensemble request's own compute times."""

    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0

    def add(self, *, input_ns: int, infer_ns: int, output_ns: int) -> None:
        self.input_ns += input_ns
        self.infer_ns += infer_ns
        self.output_ns += output_ns


FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
"""Triton's ``reason`` label values for ``nv_inference_request_failure``."""


@dataclass(slots=True)
class ModelStats:
    """Counters for one loaded model version; they start from zero at each load, as in Triton."""

    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    cache_hit: Duration = field(default_factory=Duration)
    cache_miss: Duration = field(default_factory=Duration)
    failures: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAILURE_REASONS, 0))
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    batches: dict[int, BatchSizeStats] = field(default_factory=dict)

    def record_execution(self, batch_size: int, compute_ns: int) -> None:
        """One engine execution of ``batch_size`` rows took ``compute_ns``."""
        self.execution_count += 1
        stats = self.batches.get(batch_size)
        if stats is None:
            stats = self.batches[batch_size] = BatchSizeStats()
        stats.compute_infer.add(compute_ns)
        stats.compute_input.add(0)
        stats.compute_output.add(0)

    def record_composed(
        self, *, rows: int, request_ns: int, queue_ns: int, times: ComputeTimes
    ) -> None:
        """An ensemble request of ``rows`` rows was answered: Triton counts it as one
        execution of that batch size whose compute times are its steps' (``times``)."""
        self.record_success(
            rows=rows,
            request_ns=request_ns,
            queue_ns=queue_ns,
            input_ns=times.input_ns,
            infer_ns=times.infer_ns,
            output_ns=times.output_ns,
        )
        self.execution_count += 1
        stats = self.batches.get(rows)
        if stats is None:
            stats = self.batches[rows] = BatchSizeStats()
        stats.compute_input.add(times.input_ns)
        stats.compute_infer.add(times.infer_ns)
        stats.compute_output.add(times.output_ns)

    def record_success(
        self,
        *,
        rows: int,
        request_ns: int,
        queue_ns: int,
        input_ns: int,
        infer_ns: int,
        output_ns: int,
    ) -> None:
        """A request of ``rows`` rows was answered; durations are for that request."""
        self.success.add(request_ns)
        self.queue.add(queue_ns)
        self.compute_input.add(input_ns)
        self.compute_infer.add(infer_ns)
        self.compute_output.add(output_ns)
        self.inference_count += rows
        self.last_inference_ms = time.time_ns() // 1_000_000

    def record_failure(self, *, reason: str, request_ns: int) -> None:
        """A request failed; ``reason`` is one of :data:`FAILURE_REASONS`."""
        self.fail.add(request_ns)
        self.failures[reason] = self.failures.get(reason, 0) + 1
        self.last_inference_ms = time.time_ns() // 1_000_000

    def record_cache_hit(self, *, request_ns: int, queue_ns: int, lookup_ns: int) -> None:
        """A request was answered from the response cache: a success with no execution, so
        without rows counted or compute times (and, as in Triton, no new last inference)."""
        self.success.add(request_ns)
        self.queue.add(queue_ns)
        self.cache_hit.add(lookup_ns)

    def record_cache_miss(self, lookup_ns: int) -> None:
        """A response cache lookup found nothing; the request goes on to the model."""
        self.cache_miss.add(lookup_ns)

    def record_cache_insertion(self, insertion_ns: int) -> None:
        """The answer after a miss was stored (or found too large) in ``insertion_ns``,
        which Triton adds to the miss's time."""
        self.cache_miss.add(insertion_ns, count=0)

    def to_json(self, *, name: str, version: int) -> dict[str, Any]:
        """One entry of Triton's ``model_stats`` array."""
        return {
            "name": name,
            "version": str(version),
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.to_json(),
                "fail": self.fail.to_json(),
                "queue": self.queue.to_json(),
                "compute_input": self.compute_input.to_json(),
                "compute_infer": self.compute_infer.to_json(),
                "compute_output": self.compute_output.to_json(),
                "cache_hit": self.cache_hit.to_json(),
                "cache_miss": self.cache_miss.to_json(),
            },
            "response_stats": {},
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": stats.compute_input.to_json(),
                    "compute_infer": stats.compute_infer.to_json(),
                    "compute_output": stats.compute_output.to_json(),
                }
                for size, stats in sorted(self.batches.items())
            ],
            "memory_usage": [],
        }
