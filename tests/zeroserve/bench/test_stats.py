"""Latency summaries, level results and their JSON."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from zeroserve.bench.stats import LatencySummary, LevelResult, count_errors, merge_counts


def test_percentiles_of_known_latencies():
    summary = LatencySummary.from_ns(np.arange(1, 101) * 1_000_000)
    assert summary.count == 100
    assert (summary.min_ms, summary.max_ms, summary.mean_ms) == (1.0, 100.0, 50.5)
    assert summary.p50_ms == pytest.approx(50.5)
    assert summary.p90_ms == pytest.approx(90.1)
    assert summary.p99_ms == pytest.approx(99.01)


def test_no_latencies_are_nan_not_zero():
    summary = LatencySummary.from_ns([])
    assert summary.count == 0 and math.isnan(summary.p99_ms)


def test_errors_by_kind_most_frequent_first():
    assert count_errors(["timeout", "http_503", "http_503", "connect"]) == {
        "http_503": 2,
        "connect": 1,
        "timeout": 1,
    }
    assert merge_counts({"a": 1}, {"b": 3, "a": 1}) == {"b": 3, "a": 2}


def test_level_json_has_no_nan_and_derived_figures():
    result = LevelResult(
        mode="concurrency",
        level=8.0,
        duration_s=2.0,
        ok=100,
        errors={"http_503": 100},
        throughput=50.0,
        latency=LatencySummary.from_ns([]),
        batch_size=4,
        client_cpu_cores=0.5,
    )
    document = result.to_json()
    json.dumps(document, allow_nan=False)
    assert document["latency"]["p50_ms"] is None
    assert document["error_count"] == 100
    assert document["inferences_per_s"] == 200.0
    # 0.5 cores over 2 s = 1 CPU second for 200 answers.
    assert document["client_cpu_us_per_request"] == pytest.approx(5000.0)
    assert result.label == "c=8"
