"""One model version's use of the cache: its statistics as Triton counts them, answers
stored as read-only copies no client can change, nothing stored once it is unloaded."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from data_plane.response_cache import ModelResponseCache, ResponseCache
from data_plane.stats import ModelStats

INPUTS = {"INPUT0": np.arange(4, dtype=np.float32).reshape(1, 4)}


def _view(cache: ResponseCache, stats: ModelStats | None = None) -> ModelResponseCache:
    return ModelResponseCache(cache, model="m", version=1, stats=stats or ModelStats())


def test_a_miss_then_a_hit_in_the_statistics() -> None:
    stats = ModelStats()
    view = _view(ResponseCache(10_000), stats)
    miss = view.lookup(INPUTS, None)
    assert miss.outputs is None
    assert (stats.cache_miss.count, stats.cache_hit.count) == (1, 0)
    lookup_only = stats.cache_miss.ns
    assert view.store(miss, {"OUTPUT0": INPUTS["INPUT0"] * 2})
    assert stats.cache_miss.count == 1  # storing adds its time, not a miss
    assert stats.cache_miss.ns >= lookup_only
    hit = view.lookup(INPUTS, None)
    assert hit.outputs is not None
    np.testing.assert_array_equal(hit.outputs["OUTPUT0"], INPUTS["INPUT0"] * 2)
    assert hit.key == miss.key
    assert stats.cache_miss.count == 1
    # The hit itself is counted by the inference path with the request's times.
    assert stats.cache_hit.count == 0
    stats.record_cache_hit(request_ns=10, queue_ns=2, lookup_ns=hit.lookup_ns)
    entry = stats.to_json(name="m", version=1)
    assert entry["inference_stats"]["cache_hit"] == {"count": 1, "ns": hit.lookup_ns}
    assert entry["inference_stats"]["cache_miss"]["count"] == 1
    assert entry["inference_stats"]["success"] == {"count": 1, "ns": 10}
    assert entry["inference_stats"]["queue"] == {"count": 1, "ns": 2}
    assert entry["inference_count"] == entry["execution_count"] == 0


def test_cached_answers_are_read_only_copies() -> None:
    view = _view(ResponseCache(10_000))
    produced = {"OUTPUT0": np.ones((1, 4), dtype=np.float32)}
    view.store(view.lookup(INPUTS, None), produced)
    produced["OUTPUT0"][0, 0] = 99.0  # the first client changes the answer it was given
    cached = view.lookup(INPUTS, None).outputs
    assert cached is not None
    np.testing.assert_array_equal(cached["OUTPUT0"], np.ones((1, 4), dtype=np.float32))
    with pytest.raises(ValueError, match="read-only"):
        cached["OUTPUT0"][0, 0] = 7.0
    again = view.lookup(INPUTS, None).outputs
    assert again is not None
    np.testing.assert_array_equal(again["OUTPUT0"], np.ones((1, 4), dtype=np.float32))


def test_two_loads_of_one_version_do_not_share_answers() -> None:
    cache = ResponseCache(10_000)
    first, second = _view(cache), _view(cache)
    first.store(first.lookup(INPUTS, None), {"OUTPUT0": INPUTS["INPUT0"]})
    assert first.lookup(INPUTS, None).outputs is not None
    assert second.lookup(INPUTS, None).outputs is None


def test_an_unloaded_version_drops_its_entries_and_stores_no_more() -> None:
    cache = ResponseCache(10_000)
    view, other = _view(cache), _view(cache)
    view.store(view.lookup(INPUTS, None), {"OUTPUT0": INPUTS["INPUT0"]})
    other.store(other.lookup(INPUTS, None), {"OUTPUT0": INPUTS["INPUT0"]})
    late = view.lookup({"INPUT0": INPUTS["INPUT0"] + 1}, None)
    assert view.clear() == 1
    assert not view.store(late, {"OUTPUT0": INPUTS["INPUT0"]})
    assert cache.snapshot().entries == 1
    assert other.lookup(INPUTS, None).outputs is not None


def test_an_answer_larger_than_the_cache_is_not_stored_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stats = ModelStats()
    view = _view(ResponseCache(1024), stats)
    big = {"OUTPUT0": np.zeros(1024, dtype=np.float32)}
    with caplog.at_level(logging.WARNING, logger="data_plane.response_cache.model_cache"):
        for _ in range(3):
            lookup = view.lookup(INPUTS, None)
            assert lookup.outputs is None
            assert not view.store(lookup, big)
    assert stats.cache_miss.count == 3
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "larger than the whole response cache (1024 bytes)" in warnings[0]
