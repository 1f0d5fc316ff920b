"""Prometheus metrics: Triton's ``nv_*`` families, exactly named, plus ``zeroserve_*`` ones.

Triton's counters carry no ``_total`` suffix and prometheus_client always adds one, so the
``nv_*`` families are rendered here from the repository's statistics at scrape time (one
source of truth with ``/stats``). Our own metrics live on an injected registry, LLM ones
(vLLM's names) in ``llm_metrics``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from data_plane.gpu_metrics import GpuMetrics
from data_plane.host_metrics import HostMetrics
from data_plane.llm_metrics import LLMMetrics
from data_plane.repository import LoadedVersion
from data_plane.response_cache import CacheSnapshot, ResponseCache
from data_plane.stats import FAILURE_REASONS, ModelStats
from runtimes.custom_metrics import CustomMetrics

_COUNTERS: tuple[tuple[str, str], ...] = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes"),
    ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes"),
    (
        "nv_inference_count",
        "Number of inferences performed (does not include cached requests)",
    ),
    (
        "nv_inference_exec_count",
        "Number of model executions performed (does not include cached requests)",
    ),
    (
        "nv_inference_request_duration_us",
        "Cumulative inference request duration in microseconds (includes cached requests)",
    ),
    (
        "nv_inference_queue_duration_us",
        "Cumulative inference queuing duration in microseconds (includes cached requests)",
    ),
    (
        "nv_inference_compute_input_duration_us",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
    ),
    (
        "nv_inference_compute_output_duration_us",
        "Cumulative inference compute output duration in microseconds (does not include cached "
        "requests)",
    ),
)


_MODEL_CACHE_COUNTERS: tuple[tuple[str, str, Callable[[ModelStats], int]], ...] = (
    ("nv_cache_num_hits_per_model", "Number of cache hits per model", lambda s: s.cache_hit.count),
    (
        "nv_cache_hit_duration_per_model",
        "Total cache hit duration per model, in microseconds",
        lambda s: s.cache_hit.ns // 1000,
    ),
    (
        "nv_cache_num_misses_per_model",
        "Number of cache misses per model",
        lambda s: s.cache_miss.count,
    ),
    (
        "nv_cache_miss_duration_per_model",
        "Total cache miss (insert+lookup) duration per model, in microseconds",
        lambda s: s.cache_miss.ns // 1000,
    ),
)
"""Triton's per-model cache counters, shown for the versions that use the cache."""

_CACHE_GAUGES: tuple[tuple[str, str, Callable[[CacheSnapshot], float | int]], ...] = (
    ("nv_cache_util", "Cache utilization [0.0 - 1.0]", lambda c: c.utilization),
    ("nv_cache_num_entries", "Number of responses stored in response cache", lambda c: c.entries),
    ("nv_cache_num_hits", "Number of cache hits in response cache", lambda c: c.hits),
    ("nv_cache_num_misses", "Number of cache misses in response cache", lambda c: c.misses),
    ("nv_cache_num_lookups", "Number of cache lookups in response cache", lambda c: c.lookups),
    (
        "nv_cache_num_evictions",
        "Number of cache evictions in response cache",
        lambda c: c.evictions,
    ),
    (
        "nv_cache_lookup_duration",
        "Total cache lookup duration (hit and miss), in microseconds",
        lambda c: c.lookup_ns // 1000,
    ),
    (
        "nv_cache_insertion_duration",
        "Total cache insertion duration, in microseconds",
        lambda c: c.insertion_ns // 1000,
    ),
)
"""Triton's server-wide cache gauges, shown when the server has a response cache."""


class Metrics:
    """The server's metrics; ``render`` produces the ``/metrics`` body, with the
    ``response_cache``'s gauges when the server has one, the host's (CPU, memory, pinned
    pool) and the families models define (``custom``)."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        gpus: GpuMetrics | None = None,
        response_cache: ResponseCache | None = None,
        host: HostMetrics | None = None,
    ) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.gpus = gpus or GpuMetrics()
        self.host = host or HostMetrics()
        self.custom = CustomMetrics()
        self.response_cache = response_cache
        self.model_loads = Counter(
            "zeroserve_model_loads",
            "Model version loads, by outcome",
            ["model", "outcome"],
            registry=self.registry,
        )
        self.model_load_seconds = Histogram(
            "zeroserve_model_load_seconds",
            "Time from load request to a READY model version (engine build included)",
            ["model"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=self.registry,
        )
        self.model_unloads = Counter(
            "zeroserve_model_unloads",
            "Model version unloads",
            ["model"],
            registry=self.registry,
        )
        self.llm = LLMMetrics(self.registry)

    def render(self, models: Iterable[LoadedVersion]) -> bytes:
        """Prometheus text exposition (format 0.0.4) of every metric."""
        serving = list(models)
        self.llm.refresh(
            (m.name, m.capabilities.generation_metrics)
            for m in serving
            if m.capabilities.generation_metrics is not None
        )
        lines = [
            *_triton_lines(serving),
            *_cache_lines(self.response_cache),
            *self.gpus.lines(),
            *self.host.lines(),
            *self.custom.lines(),
        ]
        return "\n".join(lines).encode() + b"\n" + generate_latest(self.registry)


def _labels(model: LoadedVersion, **extra: str) -> str:
    pairs = {"model": model.name, "version": str(model.version), **extra}
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(pairs.items()))
    return "{" + body + "}"


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _triton_lines(models: list[LoadedVersion]) -> Iterator[str]:
    values = {
        "nv_inference_request_success": lambda m: [(_labels(m), m.stats.success.count)],
        "nv_inference_request_failure": lambda m: [
            (_labels(m, reason=r), m.stats.failures.get(r, 0)) for r in FAILURE_REASONS
        ],
        "nv_inference_count": lambda m: [(_labels(m), m.stats.inference_count)],
        "nv_inference_exec_count": lambda m: [(_labels(m), m.stats.execution_count)],
        "nv_inference_request_duration_us": lambda m: [
            (_labels(m), (m.stats.success.ns + m.stats.fail.ns) // 1000)
        ],
        "nv_inference_queue_duration_us": lambda m: [(_labels(m), m.stats.queue.ns // 1000)],
        "nv_inference_compute_input_duration_us": lambda m: [
            (_labels(m), m.stats.compute_input.ns // 1000)
        ],
        "nv_inference_compute_infer_duration_us": lambda m: [
            (_labels(m), m.stats.compute_infer.ns // 1000)
        ],
        "nv_inference_compute_output_duration_us": lambda m: [
            (_labels(m), m.stats.compute_output.ns // 1000)
        ],
    }
    for name, help_text in _COUNTERS:
        yield f"# HELP {name} {help_text}"
        yield f"# TYPE {name} counter"
        for model in models:
            for labels, value in values[name](model):
                yield f"{name}{labels} {value}"
    cached = [m for m in models if m.response_cache is not None]
    for name, help_text, value_of in _MODEL_CACHE_COUNTERS if cached else ():
        yield f"# HELP {name} {help_text}"
        yield f"# TYPE {name} counter"
        for model in cached:
            yield f"{name}{_labels(model)} {value_of(model.stats)}"
    yield (
        "# HELP nv_inference_pending_request_count Instantaneous number of pending requests "
        "awaiting execution per-model."
    )
    yield "# TYPE nv_inference_pending_request_count gauge"
    for model in models:
        yield f"nv_inference_pending_request_count{_labels(model)} {model.batcher.pending_count}"
    yield ("# HELP zeroserve_executing_requests Requests inside an engine execution now, per model")
    yield "# TYPE zeroserve_executing_requests gauge"
    for model in models:
        yield f"zeroserve_executing_requests{_labels(model)} {model.batcher.executing_count}"
    yield (
        "# HELP zeroserve_model_state 1 for each loaded model version, labelled with its "
        "runtime's state (ready, sleeping, unloading, ...)"
    )
    yield "# TYPE zeroserve_model_state gauge"
    for model in models:
        state = model.runtime.state.value.lower()
        yield f"zeroserve_model_state{_labels(model, state=state)} 1"
    yield "# HELP nv_model_load_duration_secs Model load time in seconds"
    yield "# TYPE nv_model_load_duration_secs gauge"
    for model in models:
        yield f"nv_model_load_duration_secs{_labels(model)} {model.load_duration_s:.6f}"


def _cache_lines(cache: ResponseCache | None) -> Iterator[str]:
    if cache is None:
        return
    snapshot = cache.snapshot()
    for name, help_text, value_of in _CACHE_GAUGES:
        yield f"# HELP {name} {help_text}"
        yield f"# TYPE {name} gauge"
        yield f"{name} {value_of(snapshot)}"
