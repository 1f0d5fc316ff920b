"""The server-wide store: least recently used entries go first under the byte bound, an
entry larger than the bound is never stored, counters as Triton's gauges report them."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

from data_plane.response_cache import ResponseCache
from data_plane.response_cache.cache import entry_size


def _outputs(value: float, count: int = 25) -> dict[str, np.ndarray]:
    array = np.full(count, value, dtype=np.float32)
    array.setflags(write=False)
    return {"OUTPUT0": array}


def _put(cache: ResponseCache, key: bytes, outputs: dict[str, np.ndarray]) -> bool:
    return cache.put(key, outputs, size_bytes=entry_size(key, outputs), owner=b"m")


def test_entry_size_counts_tensor_bytes_names_and_key() -> None:
    numbers = {"OUT": np.zeros((2, 3), dtype=np.float64)}
    assert entry_size(b"k" * 32, numbers) == 32 + 3 + 48
    words = np.array([b"ab", b"cde", "fg"], dtype=object)
    assert entry_size(b"key", {"W": words}) == 3 + 1 + 7


def test_a_stored_answer_is_found_and_others_miss() -> None:
    cache = ResponseCache(10_000)
    outputs = _outputs(1.0)
    assert cache.get(b"a") is None
    assert _put(cache, b"a", outputs)
    found = cache.get(b"a")
    assert found is not None and found["OUTPUT0"] is outputs["OUTPUT0"]
    assert cache.get(b"b") is None
    snapshot = cache.snapshot()
    assert (snapshot.lookups, snapshot.hits, snapshot.misses, snapshot.entries) == (3, 1, 2, 1)
    assert snapshot.used_bytes == entry_size(b"a", outputs)
    assert snapshot.utilization == snapshot.used_bytes / 10_000


def test_least_recently_used_entries_are_evicted_under_the_bound() -> None:
    size = entry_size(b"a", _outputs(0.0))
    cache = ResponseCache(3 * size)
    for key in (b"a", b"b", b"c"):
        assert _put(cache, key, _outputs(0.0))
    assert cache.get(b"a") is not None  # now b is the least recently used
    assert _put(cache, b"d", _outputs(0.0))
    assert cache.get(b"b") is None
    assert all(cache.get(key) is not None for key in (b"a", b"c", b"d"))
    snapshot = cache.snapshot()
    assert (snapshot.entries, snapshot.evictions, snapshot.used_bytes) == (3, 1, 3 * size)


def test_a_large_entry_evicts_as_many_as_it_needs() -> None:
    small = entry_size(b"a", _outputs(0.0, 10))
    cache = ResponseCache(4 * small)
    for key in (b"a", b"b", b"c", b"d"):
        assert _put(cache, key, _outputs(0.0, 10))
    big = _outputs(1.0, 25)  # more than two small entries, less than three
    assert _put(cache, b"e", big)
    assert [cache.get(k) is None for k in (b"a", b"b", b"c", b"d")] == [True, True, True, False]
    snapshot = cache.snapshot()
    assert snapshot.evictions == 3
    assert snapshot.used_bytes <= snapshot.capacity_bytes


def test_an_entry_larger_than_the_whole_cache_is_not_stored() -> None:
    outputs = _outputs(0.0, 100)
    cache = ResponseCache(entry_size(b"a", outputs) - 1)
    assert _put(cache, b"b", _outputs(0.0, 1))
    assert not _put(cache, b"a", outputs)
    assert cache.get(b"a") is None
    assert cache.get(b"b") is not None  # nothing was evicted for it
    assert cache.snapshot().evictions == 0


def test_the_first_answer_under_a_key_stays() -> None:
    cache = ResponseCache(10_000)
    first, second = _outputs(1.0), _outputs(2.0)
    assert _put(cache, b"a", first)
    assert not _put(cache, b"a", second)
    found = cache.get(b"a")
    assert found is not None and found["OUTPUT0"] is first["OUTPUT0"]
    assert cache.snapshot().used_bytes == entry_size(b"a", first)


def test_discard_drops_only_the_owners_entries() -> None:
    cache = ResponseCache(10_000)
    outputs = _outputs(0.0)
    cache.put(b"a", outputs, size_bytes=100, owner=b"one")
    cache.put(b"b", outputs, size_bytes=100, owner=b"two")
    cache.put(b"c", outputs, size_bytes=100, owner=b"one")
    assert cache.discard(b"one") == 2
    assert cache.get(b"a") is None and cache.get(b"c") is None
    found = cache.get(b"b")
    assert found is not None and found["OUTPUT0"] is outputs["OUTPUT0"]
    snapshot = cache.snapshot()
    assert (snapshot.entries, snapshot.used_bytes, snapshot.evictions) == (1, 100, 0)


def test_entries_are_not_left_for_the_garbage_collector_to_walk() -> None:
    """Every full collection walks what the collector tracks, on the request path: many
    cached answers must not add to it."""
    cache = ResponseCache(10_000_000)
    gc.collect()
    gc.collect()
    before = len(gc.get_objects())
    for index in range(2000):
        outputs = _outputs(float(index))
        cache.put(
            index.to_bytes(4, "little"), outputs, size_bytes=entry_size(b"k", outputs), owner=b"m"
        )
    gc.collect()
    gc.collect()
    assert cache.snapshot().entries == 2000
    # One tracked object an entry would add 2000; what else the run allocates, a few dozen.
    assert len(gc.get_objects()) - before < 500


@pytest.mark.parametrize("size", [0, -1])
def test_a_cache_needs_a_positive_size(size: int) -> None:
    with pytest.raises(ValueError, match="positive size"):
        ResponseCache(size)


def test_threads_sharing_the_cache_keep_it_bounded_and_consistent() -> None:
    outputs = _outputs(0.0)
    size = entry_size(b"k-000-000", outputs)
    cache = ResponseCache(20 * size)
    errors: list[BaseException] = []

    def work(thread: int) -> None:
        try:
            for step in range(400):
                key = f"k-{thread:03d}-{step % 50:03d}".encode()
                if cache.get(key) is None:
                    cache.put(key, outputs, size_bytes=size, owner=bytes([thread]))
                if step % 97 == 0:
                    cache.discard(bytes([thread]))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    assert not any(thread.is_alive() for thread in threads)
    snapshot = cache.snapshot()
    assert snapshot.used_bytes == snapshot.entries * size <= 20 * size
    assert snapshot.lookups == 8 * 400 == snapshot.hits + snapshot.misses
