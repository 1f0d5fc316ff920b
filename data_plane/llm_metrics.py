"""Prometheus metrics of LLM generations, under vLLM's names so vLLM dashboards work.

vLLM's metric names carry a colon (``vllm:time_to_first_token_seconds``), which Prometheus
reserves for recording rules but accepts, and prometheus_client accepts too; the same names
are used whichever engine (transformers or vLLM) serves the model, labelled ``model_name``
as vLLM labels them. What vLLM does not have is ``zeroserve_llm_*``.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from runtimes.capabilities import GenerationMetrics, GenerationObserver, GenerationRecord

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
_TOKEN_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                      0.4, 0.5, 0.75, 1.0, 2.5)  # fmt: skip
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                60.0, 120.0, 240.0, 480.0)  # fmt: skip
_WAKE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class LLMMetrics:
    """Token latencies, token counts and engine queues per model, on ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["model_name"]
        self.time_to_first_token = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.inter_token_latency = Histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            labels,
            buckets=_TOKEN_GAP_BUCKETS,
            registry=registry,
        )
        self.e2e_latency = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            labels,
            buckets=_E2E_BUCKETS,
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", labels, registry=registry
        )
        self.generation_tokens = Counter(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            labels,
            registry=registry,
        )
        self.request_success = Counter(
            "vllm:request_success",
            "Count of finished requests, by finish reason (stop, length, abort).",
            [*labels, "finished_reason"],
            registry=registry,
        )
        self.running = Gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            labels,
            registry=registry,
        )
        self.waiting = Gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            labels,
            registry=registry,
        )
        self.sleep_transitions = Histogram(
            "zeroserve_llm_sleep_transition_seconds",
            "Time an LLM engine took to fall asleep or wake up",
            [*labels, "transition"],
            buckets=_WAKE_BUCKETS,
            registry=registry,
        )

    def observer(self, model: str) -> GenerationObserver:
        """What an LLM runtime of ``model`` calls as each generation ends."""

        def observe(record: GenerationRecord) -> None:
            self.prompt_tokens.labels(model).inc(record.prompt_tokens)
            self.generation_tokens.labels(model).inc(record.completion_tokens)
            self.request_success.labels(model, record.finish_reason).inc()
            self.e2e_latency.labels(model).observe(record.e2e_s)
            if record.first_token_s is not None:
                self.time_to_first_token.labels(model).observe(record.first_token_s)
            gaps = self.inter_token_latency.labels(model)
            for gap in record.token_gaps_s:
                gaps.observe(gap)

        return observe

    def transition(self, model: str, seconds: float, is_wake: bool) -> None:
        """One sleep or wake of ``model`` took ``seconds``."""
        self.sleep_transitions.labels(model, "wake" if is_wake else "sleep").observe(seconds)

    def refresh(self, engines: Iterable[tuple[str, GenerationMetrics]]) -> None:
        """Set the queue gauges from the engines serving now (called at scrape time)."""
        self.running.clear()
        self.waiting.clear()
        for model, engine in engines:
            load = engine.load_counts()
            self.running.labels(model).inc(load.running)
            self.waiting.labels(model).inc(load.waiting)
