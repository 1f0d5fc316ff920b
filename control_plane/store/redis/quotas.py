"""The API keys' quota counters in the cluster's Redis, shared by every activator.

Each check is one Lua script, so that every activator sees one budget and no two take the
same token. Times are the server's (``TIME``), never an activator's. Keys, under the
store's prefix:

    quota:bucket:<key id>       hash  tokens, at (ms): the rate limit's token bucket
    quota:in-flight:<key id>    zset  ticket -> when it lapses (ms): requests in flight
    quota:activations:<key id>  zset  event -> when (ms): activations in the last hour

Every key expires by itself once idle. An in-flight ticket whose release is lost (its
activator died) lapses after its lease. A failure raises ``StoreUnavailableError``; the
activator then counts locally for a while (``activator.quotas.Quotas``).
"""

from __future__ import annotations

import math
import secrets

from control_plane.store.redis.connection import CLOSE_ERRORS, bounded, open_client, redact
from foundation.keys import KeyLimits

__all__ = ["RedisQuotaCounters"]

_NOW_MS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS: bucket, in-flight. ARGV: rate per s ('' none), bucket size, in-flight limit ('' none),
# ticket, lease ms. -> {refused limit or '', wait ms}.
_ADMIT = (
    _NOW_MS
    + """
local limit = ARGV[3]
if limit ~= '' then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  if redis.call('ZCARD', KEYS[2]) >= tonumber(limit) then return {'max_in_flight', '1000'} end
end
if ARGV[1] ~= '' then
  local rate = tonumber(ARGV[1])
  local size = tonumber(ARGV[2])
  local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
  local tokens = size
  if state[1] then
    local refill = math.max(0, now - tonumber(state[2])) * rate / 1000
    tokens = math.min(size, tonumber(state[1]) + refill)
  end
  local idle_ms = math.ceil(size * 1000 / rate) + 1000
  if tokens < 1 then
    redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', now)
    redis.call('PEXPIRE', KEYS[1], idle_ms)
    return {'requests_per_s', tostring(math.ceil((1 - tokens) * 1000 / rate))}
  end
  redis.call('HSET', KEYS[1], 'tokens', tostring(tokens - 1), 'at', now)
  redis.call('PEXPIRE', KEYS[1], idle_ms)
end
if limit ~= '' then
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[5]), ARGV[4])
  redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[5]))
end
return {'', '0'}
"""
)

# KEYS: activations. ARGV: limit, window ms, event id. -> wait ms (0: counted).
_COUNT_ACTIVATION = (
    _NOW_MS
    + """
local window = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local limit = tonumber(ARGV[1])
if limit <= 0 then return window end
if redis.call('ZCARD', KEYS[1]) >= limit then
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return math.max(1, tonumber(oldest[2]) + window - now)
end
redis.call('ZADD', KEYS[1], now, ARGV[3])
redis.call('PEXPIRE', KEYS[1], window)
return 0
"""
)


class RedisQuotaCounters:
    """``activator.quotas.SharedCounters`` in Redis.

    Parameters:
        url: the cluster store's URL.
        key_prefix: the store's prefix.
        timeout_s: the most one check may take; a request waits this long at worst before
            its activator falls back to counting alone.
        max_connections: the connection pool's bound.
    """

    def __init__(
        self,
        url: str,
        *,
        key_prefix: str = "zeroserve:",
        timeout_s: float = 0.25,
        max_connections: int = 64,
    ) -> None:
        self._address = redact(url)
        self._prefix = key_prefix + "quota:"
        self._timeout_s = timeout_s
        self._pool, self._client = open_client(
            url, max_connections=max_connections, timeout_s=timeout_s
        )
        self._admit = self._client.register_script(_ADMIT)
        self._count_activation = self._client.register_script(_COUNT_ACTIVATION)
        self._events = secrets.token_hex(6)
        self._counted = 0

    async def admit(
        self, key_id: str, limits: KeyLimits, ticket: str, lease_s: float
    ) -> tuple[str | None, float]:
        rate = limits.requests_per_s
        in_flight = limits.max_in_flight
        args = [
            "" if rate is None else repr(float(rate)),
            str(limits.bucket_size),
            "" if in_flight is None else str(in_flight),
            ticket,
            str(max(1, math.ceil(lease_s * 1000))),
        ]
        keys = [f"{self._prefix}bucket:{key_id}", f"{self._prefix}in-flight:{key_id}"]
        refused, wait_ms = await bounded(
            lambda: self._admit(keys=keys, args=args),
            store=self._address,
            operation="quota admit",
            timeout_s=self._timeout_s,
            # A replay after a lost answer would take a second token.
            replay_safe=False,
        )
        return (refused or None), float(wait_ms) / 1000

    async def release(self, key_id: str, ticket: str) -> None:
        key = f"{self._prefix}in-flight:{key_id}"
        await bounded(
            lambda: self._client.zrem(key, ticket),
            store=self._address,
            operation="quota release",
            timeout_s=self._timeout_s,
        )

    async def count_activation(self, key_id: str, limit: int, window_s: float) -> float:
        self._counted += 1
        event = f"{self._events}-{self._counted}"
        key = f"{self._prefix}activations:{key_id}"
        wait_ms = await bounded(
            lambda: self._count_activation(
                keys=[key], args=[limit, max(1, math.ceil(window_s * 1000)), event]
            ),
            store=self._address,
            operation="quota activation",
            timeout_s=self._timeout_s,
            replay_safe=False,
        )
        return float(wait_ms) / 1000

    async def close(self) -> None:
        try:
            await self._client.aclose()
            await self._pool.aclose()
        except CLOSE_ERRORS:
            pass
