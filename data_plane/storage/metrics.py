"""The node cache's Prometheus metrics, on a registry the caller owns."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_FETCH_BUCKETS_S = (0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class CacheMetrics:
    """Bytes fetched, fetch durations, hits, misses, evictions and size of the node cache.

    Counts are per process: several workers on one node each report their own fetches,
    and each reports the size of the shared cache as it last saw it.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.fetched_bytes = Counter(
            "zeroserve_cache_fetched_bytes_total",
            "Bytes downloaded from object storage into the node cache",
            registry=registry,
        )
        self.fetch_duration = Histogram(
            "zeroserve_cache_fetch_duration_seconds",
            "Time to fetch a model into the node cache (misses only)",
            buckets=_FETCH_BUCKETS_S,
            registry=registry,
        )
        self.hits = Counter(
            "zeroserve_cache_hits_total",
            "Model fetches answered from the node cache without downloading",
            registry=registry,
        )
        self.misses = Counter(
            "zeroserve_cache_misses_total",
            "Model fetches that downloaded from object storage",
            registry=registry,
        )
        self.evictions = Counter(
            "zeroserve_cache_evictions_total",
            "Cache folders (model versions, engine caches) evicted to stay under the bound",
            registry=registry,
        )
        self.size_bytes = Gauge(
            "zeroserve_cache_size_bytes",
            "Bytes in the node cache when this process last looked",
            registry=registry,
        )
        self.max_bytes = Gauge(
            "zeroserve_cache_max_bytes", "The node cache's size bound", registry=registry
        )
