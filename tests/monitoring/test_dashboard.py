"""The Grafana dashboard in monitoring/grafana: well formed, and covering what operators
need. That every metric it queries is really exported is checked against a running
platform in ``tests/integration/test_monitoring_e2e.py``."""

from __future__ import annotations

import itertools

import pytest

from tests.monitoring.queries import dashboard_queries, load_dashboard, metric_names, panels

COVERED = {
    "requests, errors and latency per model": {
        "zeroserve_activator_requests_total",
        "zeroserve_activator_request_duration_seconds_bucket",
        "nv_inference_request_success",
        "nv_inference_request_failure",
    },
    "cold starts and their phases": {
        "zeroserve_activations_total",
        "zeroserve_activation_duration_seconds_bucket",
    },
    "buffer depth": {"zeroserve_activator_buffered_requests"},
    "loaded and sleeping models, replicas": {
        "zeroserve_model_state",
        "zeroserve_model_replicas",
        "zeroserve_model_desired_replicas",
        "zeroserve_workers",
    },
    "node cache hit ratio and bytes fetched": {
        "zeroserve_cache_hits_total",
        "zeroserve_cache_misses_total",
        "zeroserve_cache_fetched_bytes_total",
    },
    "GPU memory and utilization": {
        "nv_gpu_utilization",
        "nv_gpu_memory_used_bytes",
        "nv_gpu_memory_total_bytes",
    },
}


def test_every_query_parses_and_names_a_metric() -> None:
    queries = dashboard_queries(load_dashboard())
    assert len(queries) > 20
    for query in queries:
        assert metric_names(query), query


@pytest.mark.parametrize(
    ("topic", "names"), [pytest.param(topic, names, id=topic) for topic, names in COVERED.items()]
)
def test_the_dashboard_covers(topic: str, names: set[str]) -> None:
    queried = set().union(*map(metric_names, dashboard_queries(load_dashboard())))
    assert names <= queried, f"{topic}: {sorted(names - queried)} not queried"


def test_panels_are_well_formed_and_do_not_overlap() -> None:
    dashboard = load_dashboard()
    assert dashboard["uid"] and dashboard["title"] == "zeroserve"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    all_panels = list(panels(dashboard))
    ids = [p["id"] for p in all_panels]
    assert len(ids) == len(set(ids))
    for panel in all_panels:
        if panel["type"] == "row":
            continue
        assert panel["title"] and panel["description"], panel["id"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
    boxes = [p["gridPos"] for p in all_panels]
    for a, b in itertools.combinations(boxes, 2):
        apart = (
            a["x"] + a["w"] <= b["x"]
            or b["x"] + b["w"] <= a["x"]
            or a["y"] + a["h"] <= b["y"]
            or b["y"] + b["h"] <= a["y"]
        )
        assert apart, (a, b)
    assert all(box["x"] + box["w"] <= 24 for box in boxes)
