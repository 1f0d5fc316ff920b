"""The server-wide response store: entries by key, least recently used first out, bounded in
bytes, with the counters Triton's ``nv_cache_*`` gauges report."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

CachedOutputs = Mapping[str, np.ndarray]
"""A cached answer: the model's outputs by name, read-only arrays no one else changes."""


@dataclass(frozen=True, slots=True)
class CacheSnapshot:
    """The store's counters at one moment (``nv_cache_*`` server-wide gauges)."""

    capacity_bytes: int
    used_bytes: int
    entries: int
    lookups: int
    hits: int
    misses: int
    evictions: int
    lookup_ns: int
    """Time spent looking up, hits and misses together."""
    insertion_ns: int

    @property
    def utilization(self) -> float:
        """Share of the bound in use, 0.0 to 1.0."""
        return self.used_bytes / self.capacity_bytes


_Entry = tuple[tuple[tuple[str, np.ndarray], ...], int, bytes]
"""An answer as (name, array) pairs, the bytes it counts and its owner: tuples of values
the garbage collector does not track (a dict or a class instance inside would keep it
tracked), which it stops tracking after its first pass over them. A cache of many entries
then adds nothing to the walk of every full collection, which runs on the request path of
the whole server."""


class ResponseCache:
    """Answers by key, holding at most ``capacity_bytes``; the least recently used go first.

    Thread-safe: every read and change of the table happens under one lock, held for a
    dictionary operation and never across hashing or copying, so the event loop's requests
    and any other thread may share it. Entries are stored as given: the caller hands over
    arrays it made read-only and keeps no writable view of (:class:`ModelResponseCache`
    copies the model's outputs before storing them).
    """

    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes <= 0:
            raise ValueError(f"a response cache needs a positive size, not {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._used_bytes = 0
        self._lookups = 0
        self._hits = 0
        self._evictions = 0
        self._lookup_ns = 0
        self._insertion_ns = 0

    def get(self, key: bytes) -> CachedOutputs | None:
        """The answer stored under ``key`` (now the most recently used), or None."""
        started = time.monotonic_ns()
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                self._hits += 1
            self._lookups += 1
            self._lookup_ns += time.monotonic_ns() - started
        return None if entry is None else dict(entry[0])

    def put(self, key: bytes, outputs: CachedOutputs, *, size_bytes: int, owner: bytes) -> bool:
        """Store ``outputs`` (``size_bytes`` as :func:`entry_size` counts them) under ``key``,
        evicting the least recently used entries to make room; ``owner`` names who may
        :meth:`discard` it. False, and nothing stored, when the entry alone is larger than
        the whole cache or ``key`` is already stored (a concurrent miss got there first; the
        first answer stays)."""
        if size_bytes > self.capacity_bytes:
            return False
        started = time.monotonic_ns()
        with self._lock:
            if key in self._entries:
                stored = False
            else:
                while self._used_bytes + size_bytes > self.capacity_bytes:
                    _, evicted = self._entries.popitem(last=False)
                    self._used_bytes -= evicted[1]
                    self._evictions += 1
                self._entries[key] = (tuple(outputs.items()), size_bytes, owner)
                self._used_bytes += size_bytes
                stored = True
            self._insertion_ns += time.monotonic_ns() - started
        return stored

    def discard(self, owner: bytes) -> int:
        """Drop every entry ``owner`` stored (its model version is unloaded: none of them
        can be asked for again); returns how many. Not counted as evictions."""
        with self._lock:
            keys = [key for key, entry in self._entries.items() if entry[2] == owner]
            for key in keys:
                self._used_bytes -= self._entries.pop(key)[1]
        return len(keys)

    def snapshot(self) -> CacheSnapshot:
        with self._lock:
            return CacheSnapshot(
                capacity_bytes=self.capacity_bytes,
                used_bytes=self._used_bytes,
                entries=len(self._entries),
                lookups=self._lookups,
                hits=self._hits,
                misses=self._lookups - self._hits,
                evictions=self._evictions,
                lookup_ns=self._lookup_ns,
                insertion_ns=self._insertion_ns,
            )


def entry_size(key: bytes, outputs: CachedOutputs) -> int:
    """The bytes an entry counts against the bound: its tensors' data (a BYTES element's
    own length), their names and the key. Python's object headers are left out, so the
    process holds somewhat more than the bound for many tiny entries."""
    size = len(key)
    for name, array in outputs.items():
        size += len(name.encode())
        if array.dtype == object:
            size += sum(_element_size(element) for element in array.flat)
        else:
            size += array.nbytes
    return size


def _element_size(element: object) -> int:
    if isinstance(element, bytes | str):
        return len(element)
    return 8  # a number in an object array: its value's size, about
