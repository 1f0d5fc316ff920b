"""Per-key quotas: requests per second (a token bucket with a burst), requests in flight,
and activations (cold starts) per hour.

The decisions are pure functions of a counter's state and the time (:func:`take_token`,
:func:`count_in_window`). :class:`LocalCounters` keeps the counters in this process;
:class:`Quotas` applies a key's limits through the counters shared by every activator (the
cluster's Redis, :class:`SharedCounters`) when it has them, and falls back to its local
counters for ``fallback_s`` whenever the shared ones fail: each activator then enforces
each limit on its own, so a store outage multiplies the bound by the number of activators
but never lifts it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from activator.errors import QuotaExceededError
from foundation.keys import ApiKeyRecord, KeyLimits

__all__ = [
    "Bucket",
    "LocalCounters",
    "Quotas",
    "SharedCounters",
    "count_in_window",
    "take_token",
]

logger = logging.getLogger(__name__)

_V = TypeVar("_V")

HOUR_S = 3600.0

RATE = "requests_per_s"
IN_FLIGHT = "max_in_flight"
ACTIVATIONS = "activations_per_hour"


@dataclass(frozen=True, slots=True)
class Bucket:
    """A token bucket's state: ``tokens`` at time ``at``."""

    tokens: float
    at: float


def take_token(
    bucket: Bucket | None, *, rate: float, size: int, now: float
) -> tuple[float, Bucket]:
    """Take one token: (0.0, the bucket after) when there is one, else (seconds until there
    is, the bucket refilled to ``now`` but not taken from). A new bucket starts full."""
    if bucket is None:
        tokens = float(size)
    else:
        tokens = min(float(size), bucket.tokens + max(0.0, now - bucket.at) * rate)
    if tokens >= 1.0:
        return 0.0, Bucket(tokens - 1.0, now)
    return (1.0 - tokens) / rate, Bucket(tokens, now)


def count_in_window(times: deque[float], *, limit: int, window_s: float, now: float) -> float:
    """Count one event at ``now`` unless ``limit`` events fall within the last ``window_s``:
    0.0 when counted (appended to ``times``), else seconds until the oldest leaves the
    window. ``times`` is oldest first; what left the window is dropped from it."""
    while times and times[0] <= now - window_s:
        times.popleft()
    if limit <= 0:
        return window_s
    if len(times) >= limit:
        return times[0] + window_s - now
    times.append(now)
    return 0.0


class SharedCounters(Protocol):
    """Counters every activator shares (the cluster's store). Methods raise on a store
    failure; :class:`Quotas` then falls back to local counters."""

    async def admit(
        self, key_id: str, limits: KeyLimits, ticket: str, lease_s: float
    ) -> tuple[str | None, float]:
        """Take a token and an in-flight place (held as ``ticket``, forgotten after
        ``lease_s`` should its release be lost): (None, 0.0) when both are given, else
        (the limit that refused, seconds to wait)."""
        ...

    async def release(self, key_id: str, ticket: str) -> None:
        """Give the in-flight place of ``ticket`` back."""
        ...

    async def count_activation(self, key_id: str, limit: int, window_s: float) -> float:
        """Count an activation unless ``limit`` are within ``window_s``: 0.0, else seconds
        to wait."""
        ...


class LocalCounters:
    """The counters of :class:`SharedCounters`, in this process (every call is one step on
    the event loop, so no lock). Holds at most ``max_keys`` keys' counters; past it, the
    counters of keys with nothing in flight are dropped, oldest first (a bucket starts
    full again, which only ever errs towards admitting)."""

    def __init__(self, *, max_keys: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._max_keys = max_keys
        self._clock = clock
        self._buckets: dict[str, Bucket] = {}
        self._in_flight: dict[str, int] = {}
        self._activations: dict[str, deque[float]] = {}

    async def admit(
        self, key_id: str, limits: KeyLimits, ticket: str, lease_s: float
    ) -> tuple[str | None, float]:
        return self.admit_now(key_id, limits)

    def admit_now(self, key_id: str, limits: KeyLimits) -> tuple[str | None, float]:
        """:meth:`admit` without awaiting (tickets are not needed: releases are reliable
        within one process)."""
        held = self._in_flight.get(key_id, 0)
        if limits.max_in_flight is not None and held >= limits.max_in_flight:
            return IN_FLIGHT, 1.0
        rate = limits.requests_per_s
        if rate is not None:
            wait_s, bucket = take_token(
                self._buckets.get(key_id), rate=rate, size=limits.bucket_size, now=self._clock()
            )
            self._keep(self._buckets, key_id, bucket)
            if wait_s > 0:
                return RATE, wait_s
        if limits.max_in_flight is not None:
            self._in_flight[key_id] = held + 1
        return None, 0.0

    async def release(self, key_id: str, ticket: str) -> None:
        self.release_now(key_id)

    def release_now(self, key_id: str) -> None:
        held = self._in_flight.get(key_id, 0)
        if held <= 1:
            self._in_flight.pop(key_id, None)
        else:
            self._in_flight[key_id] = held - 1

    async def count_activation(self, key_id: str, limit: int, window_s: float) -> float:
        times = self._activations.get(key_id)
        if times is None:
            times = deque()
            self._keep(self._activations, key_id, times)
        return count_in_window(times, limit=limit, window_s=window_s, now=self._clock())

    def _keep(self, table: dict[str, _V], key_id: str, value: _V) -> None:
        if key_id not in table and len(table) >= self._max_keys:
            for old in list(table)[: max(1, self._max_keys // 8)]:
                if old not in self._in_flight:
                    del table[old]
        table[key_id] = value


class Quotas:
    """Applies keys' limits, through shared counters when there are some.

    Parameters:
        local: this activator's own counters (the fallback, or the only ones embedded).
        shared: every activator's counters; None uses ``local`` only.
        fallback_s: after a shared counter fails, how long ``local`` stands in before the
            shared ones are tried again.
        lease_s: how long a shared in-flight place outlives a lost release (longer than any
            request may take).
        clock: monotonic seconds.
    """

    def __init__(
        self,
        local: LocalCounters,
        shared: SharedCounters | None = None,
        *,
        fallback_s: float = 5.0,
        lease_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._local = local
        self._shared = shared
        self._fallback_s = fallback_s
        self._lease_s = lease_s
        self._clock = clock
        self._shared_down_until = -math.inf
        # Tickets are unique across activators: this instance's random part, then a count.
        self._ticket_prefix = secrets.token_hex(6)
        self._tickets = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def admit(self, key: ApiKeyRecord) -> Callable[[], None] | None:
        """Let a request of ``key`` in: the call that gives its in-flight place back when
        it ends (None when the key has no in-flight limit).

        Raises:
            QuotaExceededError: the key is over its rate or in-flight limit.
        """
        limits = key.limits
        if limits.requests_per_s is None and limits.max_in_flight is None:
            return None
        shared = self._usable_shared()
        if shared is None:
            refused, wait_s = self._local.admit_now(key.id, limits)
            self._refuse_if(key, refused, wait_s)
            if limits.max_in_flight is None:
                return None
            return lambda: self._local.release_now(key.id)
        self._tickets += 1
        ticket = f"{self._ticket_prefix}-{self._tickets}"
        try:
            refused, wait_s = await shared.admit(key.id, limits, ticket, self._lease_s)
        except Exception as exc:
            self._shared_failed(exc)
            return await self.admit(key)
        self._refuse_if(key, refused, wait_s)
        if limits.max_in_flight is None:
            return None
        return lambda: self._release_shared(shared, key.id, ticket)

    async def charge_activation(self, key: ApiKeyRecord) -> None:
        """Count a cold start triggered by a request of ``key``.

        Raises:
            QuotaExceededError: the key's activations in the last hour are at its limit.
        """
        limit = key.limits.activations_per_hour
        if limit is None:
            return
        shared = self._usable_shared()
        counters: SharedCounters | LocalCounters = shared or self._local
        try:
            wait_s = await counters.count_activation(key.id, limit, HOUR_S)
        except Exception as exc:
            self._shared_failed(exc)
            wait_s = await self._local.count_activation(key.id, limit, HOUR_S)
        self._refuse_if(key, ACTIVATIONS if wait_s > 0 else None, wait_s)

    async def close(self) -> None:
        """Wait for shared releases still under way."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _usable_shared(self) -> SharedCounters | None:
        if self._shared is None or self._clock() < self._shared_down_until:
            return None
        return self._shared

    def _shared_failed(self, exc: Exception) -> None:
        if self._clock() >= self._shared_down_until:
            logger.warning(
                "shared quota counters failed (%s); limiting with this activator's own "
                "counters for %.0f s",
                exc,
                self._fallback_s,
            )
        self._shared_down_until = self._clock() + self._fallback_s

    def _release_shared(self, shared: SharedCounters, key_id: str, ticket: str) -> None:
        task = asyncio.get_running_loop().create_task(
            self._release(shared, key_id, ticket), name="quota-release"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _release(self, shared: SharedCounters, key_id: str, ticket: str) -> None:
        try:
            await shared.release(key_id, ticket)
        except Exception as exc:
            # The place lapses after lease_s by itself.
            logger.warning("releasing an in-flight place of key %s failed: %s", key_id, exc)

    @staticmethod
    def _refuse_if(key: ApiKeyRecord, refused: str | None, wait_s: float) -> None:
        if refused is None:
            return
        limits = key.limits
        value = {
            RATE: limits.requests_per_s,
            IN_FLIGHT: limits.max_in_flight,
            ACTIVATIONS: limits.activations_per_hour,
        }.get(refused)
        raise QuotaExceededError(
            key_id=key.id,
            limit=refused,
            value=float(value or 0),
            retry_after_s=max(1, math.ceil(wait_s)),
        )
