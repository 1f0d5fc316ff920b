"""One loaded model version's way into the server's response cache."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from data_plane.response_cache.cache import CachedOutputs, ResponseCache, entry_size
from data_plane.response_cache.key import request_key
from data_plane.stats import ModelStats
from runtimes.model_request import RequestContext

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CacheLookup:
    """What a lookup found: ``outputs`` on a hit, None on a miss (then
    :meth:`ModelResponseCache.store` takes the lookup back with the model's answer)."""

    key: bytes
    outputs: CachedOutputs | None
    start_ns: int
    """When the lookup began, after the key was computed (``time.monotonic_ns``)."""
    lookup_ns: int


class ModelResponseCache:
    """The response cache as one model version uses it: lookups and stores under keys
    of that version (of this load: a reloaded model never sees its predecessor's answers),
    counted in its statistics as Triton counts them.

    A hit counts in ``cache_hit`` (the lookup's time) and, recorded by the caller with the
    request's times, as a success without an execution. A miss counts in ``cache_miss``
    with the lookup's time plus, once the model answered, the time to store the answer,
    whether or not it could be stored.
    """

    def __init__(
        self, cache: ResponseCache, *, model: str, version: int, stats: ModelStats
    ) -> None:
        self._cache = cache
        self._stats = stats
        self.model = model
        self.version = version
        self._identity = f"{model}\0{version}\0".encode() + uuid.uuid4().bytes
        self._has_warned = False
        self._is_cleared = False

    def lookup(
        self, inputs: Mapping[str, np.ndarray], context: RequestContext | None
    ) -> CacheLookup:
        """Look for the answer to a request with ``inputs`` (and ``context``, for models
        given each request's own outputs and parameters)."""
        key = request_key(self._identity, inputs, context)
        started = time.monotonic_ns()
        outputs = self._cache.get(key)
        lookup_ns = time.monotonic_ns() - started
        if outputs is None:
            self._stats.record_cache_miss(lookup_ns)
        return CacheLookup(key, outputs, started, lookup_ns)

    def store(self, lookup: CacheLookup, produced: Mapping[str, np.ndarray]) -> bool:
        """Keep ``produced``, the model's answer after a miss, for the next request with
        the same key; returns whether it was stored. The arrays are copied and the copies
        made read-only, so neither the client given ``produced`` nor any later one can
        change a cached answer."""
        started = time.monotonic_ns()
        size = entry_size(lookup.key, produced)
        stored = False
        if self._is_cleared:
            pass  # a request that finished as its version was unloaded: no one can ask again
        elif size <= self._cache.capacity_bytes:
            outputs = {name: _frozen_copy(array) for name, array in produced.items()}
            stored = self._cache.put(lookup.key, outputs, size_bytes=size, owner=self._identity)
        elif not self._has_warned:
            self._has_warned = True
            logger.warning(
                "an answer of model %s version %s (%d bytes) is larger than the whole response "
                "cache (%d bytes) and is not cached; further ones are not logged",
                self.model,
                self.version,
                size,
                self._cache.capacity_bytes,
            )
        self._stats.record_cache_insertion(time.monotonic_ns() - started)
        return stored

    def clear(self) -> int:
        """Drop this version's entries and store no more (it is unloaded); returns how
        many were dropped."""
        self._is_cleared = True
        return self._cache.discard(self._identity)


def _frozen_copy(array: np.ndarray) -> np.ndarray:
    copy = np.array(array, copy=True, order="C")
    copy.setflags(write=False)
    return copy
