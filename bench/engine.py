"""The engine alone: ``InferenceSession.run`` in a loop, set up exactly as the server sets it up.

The server (``runtimes/onnx/builder.py``) builds its session from a fresh
``ort.SessionOptions``: ``intra_op_num_threads`` from its settings where set, else, with
thread spinning, by model size (``runtimes.onnx.threads.choose_threads``: one thread for a
small model), ``inter_op_num_threads`` 0 (ONNX Runtime chooses), the CPU provider only for
``device == "cpu"``, and calls ``session.run(output_names, feeds)``. The baseline does
the same, in this process.
"""

from __future__ import annotations

import os
import resource
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from bench.machine import busy_cpu_seconds
from bench.models import INPUT_NAME, OUTPUT_NAME

PROVIDERS: Final = ["CPUExecutionProvider"]
INTRA_OP_THREADS: Final = 0
"""What the server passes by default (``DataPlaneSettings.intra_op_threads``)."""
INTER_OP_THREADS: Final = 0
"""What the server passes by default (``DataPlaneSettings.inter_op_threads``)."""


@dataclass(frozen=True)
class EngineResult:
    """One timed loop of ``run`` calls at a fixed batch size."""

    batch: int
    calls: int
    duration_s: float
    throughput: float
    """Rows (inferences) per second."""
    p50_ms: float
    p90_ms: float
    p99_ms: float
    cpu_cores: float
    """CPU time this process used over the loop, per wall-clock second."""
    other_cpu_cores: float
    """CPU the rest of the machine used meanwhile (other processes: noise), in cores."""


class Engine:
    """One ONNX Runtime session on a generated model."""

    def __init__(self, model_path: Path, *, intra_op_threads: int | None = None) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        from runtimes.onnx.threads import choose_threads

        # One instance, as the benchmarks' configs declare.
        policy = choose_threads(
            weight_bytes=model_path.stat().st_size, instances=1, cores=len(os.sched_getaffinity(0))
        )
        threads = intra_op_threads or INTRA_OP_THREADS or policy.intra_op_threads
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = INTER_OP_THREADS
        spinning = "1" if policy.is_spinning and threads != 1 else "0"
        options.add_session_config_entry("session.intra_op.allow_spinning", spinning)
        options.add_session_config_entry("session.inter_op.allow_spinning", spinning)
        self._session: Any = ort.InferenceSession(
            str(model_path), sess_options=options, providers=PROVIDERS
        )

    def run(self, rows: np.ndarray) -> np.ndarray:
        """One call, as the server makes it."""
        outputs = self._session.run([OUTPUT_NAME], {INPUT_NAME: rows})
        return np.asarray(outputs[0])

    def measure(
        self, rows: np.ndarray, *, duration_s: float, warmup_s: float, callers: int = 1
    ) -> EngineResult:
        """Call :meth:`run` on ``rows`` for ``warmup_s`` untimed, then ``duration_s`` timed.

        ``callers`` threads call concurrently on the one session, as the server's
        ``instance_group`` count lets that many batches run at once.
        """
        deadline = time.perf_counter() + warmup_s
        while time.perf_counter() < deadline:
            self.run(rows)
        per_caller: list[list[int]] = [[] for _ in range(callers)]
        usage = resource.getrusage(resource.RUSAGE_SELF)
        busy_s = busy_cpu_seconds()
        started = time.perf_counter_ns()
        deadline_ns = started + int(duration_s * 1e9)

        def loop(latencies_ns: list[int]) -> None:
            now = time.perf_counter_ns()
            while now < deadline_ns:
                self.run(rows)
                after = time.perf_counter_ns()
                latencies_ns.append(after - now)
                now = after

        threads = [threading.Thread(target=loop, args=(lat,)) for lat in per_caller[1:]]
        for thread in threads:
            thread.start()
        loop(per_caller[0])
        for thread in threads:
            thread.join()
        now = time.perf_counter_ns()
        latencies_ns = [value for lat in per_caller for value in lat]
        elapsed_s = (now - started) / 1e9
        busy_s = busy_cpu_seconds() - busy_s
        end_usage = resource.getrusage(resource.RUSAGE_SELF)
        cpu_s = (end_usage.ru_utime - usage.ru_utime) + (end_usage.ru_stime - usage.ru_stime)
        p50, p90, p99 = np.percentile(np.asarray(latencies_ns, dtype=np.float64), [50, 90, 99])
        batch = int(rows.shape[0])
        return EngineResult(
            batch=batch,
            calls=len(latencies_ns),
            duration_s=elapsed_s,
            throughput=batch * len(latencies_ns) / elapsed_s,
            p50_ms=float(p50) / 1e6,
            p90_ms=float(p90) / 1e6,
            p99_ms=float(p99) / 1e6,
            cpu_cores=cpu_s / elapsed_s,
            other_cpu_cores=max(busy_s - cpu_s, 0.0) / elapsed_s,
        )
