"""The control plane's Prometheus metrics, on a registry the caller owns (STYLE C12)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["ControlPlaneMetrics"]

_ACTIVATION_BUCKETS_S = (
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
)


class ControlPlaneMetrics:
    """Cold starts, unloads and workers, as the admin port's ``/metrics`` exposes them."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.activation_duration = Histogram(
            "zeroserve_activation_duration_seconds",
            "Time spent in each phase of bringing a replica up (worker, fetch, engine, "
            "load, total) and from queued to the first answered request (first_response); "
            "cache is hit, miss or unknown",
            ["phase", "cache"],
            buckets=_ACTIVATION_BUCKETS_S,
            registry=registry,
        )
        self.activations = Counter(
            "zeroserve_activations_total",
            "Replica activations by outcome (ready, revived, failed) and trigger",
            ["outcome", "trigger"],
            registry=registry,
        )
        self.activation_bytes = Counter(
            "zeroserve_activation_fetched_bytes_total",
            "Bytes workers downloaded into the node cache for activations",
            registry=registry,
        )
        self.unloads = Counter(
            "zeroserve_replica_unloads_total",
            "Replicas taken away, by reason (idle, evicted, scale_down, admin, deleted, reload)",
            ["reason"],
            registry=registry,
        )
        self.worker_starts = Counter(
            "zeroserve_worker_starts_total", "Workers started", registry=registry
        )
        self.worker_stops = Counter(
            "zeroserve_worker_stops_total",
            "Workers stopped, by reason (idle, lost, shutdown)",
            ["reason"],
            registry=registry,
        )
        self.workers = Gauge(
            "zeroserve_workers", "Workers up now (ready or starting)", registry=registry
        )
        self.replicas = Gauge(
            "zeroserve_model_replicas", "Ready replicas per model", ["model"], registry=registry
        )
        self.desired_replicas = Gauge(
            "zeroserve_model_desired_replicas",
            "Replicas the autoscaler wants per model",
            ["model"],
            registry=registry,
        )
        self.replica_seconds = Counter(
            "zeroserve_model_replica_seconds_total",
            "Replica-seconds (GPU-seconds on GPU pools, device-seconds on CPU pools) per "
            "model: serving (requests in flight), idle (loaded, none) and loading",
            ["model", "state"],
            registry=registry,
        )
        self.cold_starts = Counter(
            "zeroserve_model_cold_starts_total",
            "Activations a request waited for, per model",
            ["model"],
            registry=registry,
        )
        self.cold_start_wait = Counter(
            "zeroserve_model_cold_start_wait_seconds_total",
            "Time requests waited for those activations, per model (summed)",
            ["model"],
            registry=registry,
        )
        self.is_acting = Gauge(
            "zeroserve_control_plane_acting",
            "1 while this control-plane replica holds the lease",
            registry=registry,
        )
