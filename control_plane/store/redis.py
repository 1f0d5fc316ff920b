"""The state store for the cluster: one Redis (ElastiCache) shared by every replica.

Layout, every key under ``key_prefix`` (``zeroserve:`` by default):

    models                      hash   name -> ModelRecord JSON
    workers                     hash   worker id -> WorkerRecord JSON
    placements                  hash   JSON ``[model, worker_id]`` -> Placement JSON
    sleeping                    hash   JSON ``[model, worker_id]`` -> Placement JSON (asleep)
    activation-requests         zset   model -> when its pending request lapses (server ms)
    first-responses             zset   FirstResponse JSON -> when it lapses (server ms)
    timeline:<model>            list   cold-start timelines as JSON, newest first, capped
    traffic:<model>             hash   activator id -> TrafficReport JSON
    traffic-expiry:<model>      zset   activator id -> when that report lapses (server ms)
    lease                       string the acting control plane's holder id, with a PX ttl

    events:placements           channel  {"kind": "added"|"removed", "placement": {...}}
    events:activations          channel  model name
    events:first-responses      channel  FirstResponse JSON

All placements share one hash: there are hundreds at most, and removing a worker's or a
model's placements is then one atomic scan of one key.

Writes that must be seen together (a placement and its event, a worker and its placements)
run as one Lua script, so an event is published in the same atomic step as the change it
describes and subscribers see changes in the order they happened. Expiries use the server's
clock (``TIME`` inside scripts, ``PX``), never a replica's. Scripts touch several keys at
once, so the store needs Redis 6 or newer with cluster mode disabled (one shard; read
replicas and failover are fine).

Failure: every call is bounded by ``timeout_s`` and raises ``StoreUnavailableError`` when
Redis cannot be reached or does not answer in time. redis-py itself never retries: a pub/sub
connection that re-subscribed silently would hide lost events, and a replayed write could
change its answer (a create would report a conflict with itself). The store retries once,
after a connection error, only calls whose replay gives the same outcome. Subscriptions
reconnect on their own, with capped exponential backoff, and announce every reconnect to
their consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import orjson
import redis.exceptions
from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.asyncio.connection import BlockingConnectionPool
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from control_plane.records import (
    FirstResponse,
    ModelRecord,
    Placement,
    PlacementEvent,
    PlacementEventKind,
    TrafficReport,
    WorkerRecord,
)
from control_plane.store.base import StateStore, StoreConflictError
from control_plane.store.errors import StoreUnavailableError

__all__ = ["RedisStateStore"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

_RESYNC = PlacementEvent(PlacementEventKind.RESYNC)

# What an outage looks like from redis-py and asyncio. ReadOnlyError is a replica answering
# after a failover; BusyLoadingError (a ConnectionError) is a server still loading its data.
_OUTAGE_ERRORS: tuple[type[Exception], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ReadOnlyError,
    TimeoutError,
    OSError,
)
# What a subscription survives by reconnecting: an outage, including one met by the catch-up
# read it makes after subscribing.
_SUBSCRIPTION_ERRORS: tuple[type[Exception], ...] = (*_OUTAGE_ERRORS, StoreUnavailableError)
# What closing a connection may raise; the connection is dropped either way.
_CLOSE_ERRORS: tuple[type[Exception], ...] = (*_OUTAGE_ERRORS, redis.exceptions.RedisError)

# ---- Lua scripts ----

_NOW_MS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS: models. ARGV: name, record JSON. -> 1 replaced, 0 absent.
_UPDATE_MODEL = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"""

# Removes every placement whose JSON field ``field`` equals ``value``, publishing REMOVED.
_REMOVE_PLACEMENTS_WHERE = """
local function remove_placements_where(hash, field, value, channel)
  local entries = redis.call('HGETALL', hash)
  for i = 1, #entries, 2 do
    if cjson.decode(entries[i + 1])[field] == value then
      redis.call('HDEL', hash, entries[i])
      redis.call('PUBLISH', channel, '{"kind":"removed","placement":' .. entries[i + 1] .. '}')
    end
  end
end
"""

# Removes every sleeping replica whose JSON field ``field`` equals ``value`` (no event).
_REMOVE_SLEEPING_WHERE = """
local function remove_sleeping_where(hash, field, value)
  local entries = redis.call('HGETALL', hash)
  for i = 1, #entries, 2 do
    if cjson.decode(entries[i + 1])[field] == value then redis.call('HDEL', hash, entries[i]) end
  end
end
"""

# KEYS: models, placements, timeline, traffic, traffic-expiry, activation-requests, sleeping.
# ARGV: name, placement channel. -> 1 if the record existed.
_DELETE_MODEL = (
    _REMOVE_PLACEMENTS_WHERE
    + _REMOVE_SLEEPING_WHERE
    + """
local existed = redis.call('HDEL', KEYS[1], ARGV[1])
remove_placements_where(KEYS[2], 'model', ARGV[1], ARGV[2])
remove_sleeping_where(KEYS[7], 'model', ARGV[1])
redis.call('DEL', KEYS[3], KEYS[4], KEYS[5])
redis.call('ZREM', KEYS[6], ARGV[1])
return existed
"""
)

# KEYS: workers, placements, sleeping. ARGV: worker id, placement channel.
_REMOVE_WORKER = (
    _REMOVE_PLACEMENTS_WHERE
    + _REMOVE_SLEEPING_WHERE
    + """
redis.call('HDEL', KEYS[1], ARGV[1])
remove_placements_where(KEYS[2], 'worker_id', ARGV[1], ARGV[2])
remove_sleeping_where(KEYS[3], 'worker_id', ARGV[1])
return 1
"""
)

# KEYS: placements, activation-requests. ARGV: field, placement JSON, model, channel.
_ADD_PLACEMENT = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZREM', KEYS[2], ARGV[3])
redis.call('PUBLISH', ARGV[4], '{"kind":"added","placement":' .. ARGV[2] .. '}')
return 1
"""

# KEYS: placements. ARGV: field, channel. -> 1 removed, 0 absent.
_REMOVE_PLACEMENT = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('PUBLISH', ARGV[2], '{"kind":"removed","placement":' .. raw .. '}')
return 1
"""

# KEYS: activation-requests. ARGV: model, pending ttl ms, channel. -> 1 published, 0 pending.
_REQUEST_ACTIVATION = (
    _NOW_MS
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('PUBLISH', ARGV[3], ARGV[1])
return 1
"""
)

# KEYS: activation-requests. -> pending model names.
_PENDING_ACTIVATIONS = (
    _NOW_MS
    + """
return redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
"""
)

# KEYS: first-responses. ARGV: report JSON, ttl ms, channel.
_REPORT_FIRST_RESPONSE = (
    _NOW_MS
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
-- The key vanishes once nothing was reported for a ttl.
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PUBLISH', ARGV[3], ARGV[1])
return 1
"""
)

# KEYS: first-responses. -> kept report JSONs, oldest first.
_KEPT_FIRST_RESPONSES = (
    _NOW_MS
    + """
return redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
"""
)

# KEYS: traffic, traffic-expiry. ARGV: activator id, report JSON, ttl ms.
_REPORT_TRAFFIC = (
    _NOW_MS
    + """
local ttl = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], now + ttl, ARGV[1])
-- Both keys vanish once no activator has reported for a ttl.
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
return 1
"""
)

# KEYS: traffic, traffic-expiry. -> unexpired report JSONs.
_TRAFFIC = (
    _NOW_MS
    + """
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for _, activator in ipairs(expired) do redis.call('HDEL', KEYS[1], activator) end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
return redis.call('HVALS', KEYS[1])
"""
)

# KEYS: timeline. ARGV: id, timeline JSON. -> 1 replaced, 0 not kept.
_UPDATE_ACTIVATION = """
local entries = redis.call('LRANGE', KEYS[1], 0, -1)
for i, raw in ipairs(entries) do
  local ok, doc = pcall(cjson.decode, raw)
  if ok and type(doc) == 'table' and doc['id'] == ARGV[1] then
    redis.call('LSET', KEYS[1], i - 1, ARGV[2])
    return 1
  end
end
return 0
"""

# KEYS: lease. ARGV: holder, ttl ms. Renews the holder's own lease, or takes one that lapsed
# between the caller's SET NX and this script. -> 1 held, 0 another holder has it.
_RENEW_LEASE = """
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not current then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""

# KEYS: lease. ARGV: holder. Deletes only the holder's own lease.
_RELEASE_LEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class RedisStateStore(StateStore):
    """A :class:`StateStore` in Redis, shared by every control-plane and activator replica.

    Connects lazily: constructing one does no I/O, the first call reaches the server.

    Parameters:
        url: ``redis://[user:password@]host:port/db``, or ``rediss://`` for TLS.
        key_prefix: put before every key and channel, so several installations can share
            one Redis.
        timeout_s: the most one call may take, connecting included, before it raises
            StoreUnavailableError.
        max_connections: the connection pool's bound; every open subscription holds one.
        traffic_ttl_s: a traffic report no longer counts this long after it was made.
        activation_pending_ttl_s: an activation request stays pending (and repeats of it are
            not published again) for this long, unless a placement of the model comes first;
            a first response is kept this long too.
        keepalive_s: an idle subscription pings Redis this often and reconnects when no
            answer comes within ``timeout_s``, so a silently dead connection is noticed.
        reconnect_backoff_initial_s: a subscription's first wait before reconnecting; each
            further failure doubles it (with jitter) up to ``reconnect_backoff_max_s``.
        reconnect_backoff_max_s: the longest wait between reconnect attempts.
    """

    def __init__(
        self,
        url: str,
        *,
        key_prefix: str = "zeroserve:",
        timeout_s: float = 2.0,
        max_connections: int = 32,
        traffic_ttl_s: float = 30.0,
        activation_pending_ttl_s: float = 30.0,
        keepalive_s: float = 5.0,
        reconnect_backoff_initial_s: float = 0.1,
        reconnect_backoff_max_s: float = 5.0,
    ) -> None:
        scheme = urlsplit(url).scheme
        if scheme not in ("redis", "rediss"):
            raise ValueError(f"not a redis:// or rediss:// URL (scheme {scheme!r})")
        for name, value in {
            "timeout_s": timeout_s,
            "traffic_ttl_s": traffic_ttl_s,
            "activation_pending_ttl_s": activation_pending_ttl_s,
            "keepalive_s": keepalive_s,
            "reconnect_backoff_initial_s": reconnect_backoff_initial_s,
        }.items():
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if reconnect_backoff_max_s < reconnect_backoff_initial_s:
            raise ValueError("reconnect_backoff_max_s must be >= reconnect_backoff_initial_s")
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")

        self._address = _redact(url)
        self._timeout_s = timeout_s
        self._traffic_ttl_ms = _to_ms(traffic_ttl_s)
        self._activation_pending_ttl_ms = _to_ms(activation_pending_ttl_s)
        self._keepalive_s = keepalive_s
        self._backoff_initial_s = reconnect_backoff_initial_s
        self._backoff_max_s = reconnect_backoff_max_s
        # A subscription wakes this often to notice close() and to decide on keepalive pings.
        self._poll_s = min(keepalive_s, 1.0)

        self._prefix = key_prefix
        self._models_key = key_prefix + "models"
        self._workers_key = key_prefix + "workers"
        self._placements_key = key_prefix + "placements"
        self._sleeping_key = key_prefix + "sleeping"
        self._activation_requests_key = key_prefix + "activation-requests"
        self._first_responses_key = key_prefix + "first-responses"
        self._lease_key = key_prefix + "lease"
        self._placement_channel = key_prefix + "events:placements"
        self._activation_channel = key_prefix + "events:activations"
        self._first_response_channel = key_prefix + "events:first-responses"

        self._pool: BlockingConnectionPool = BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            # Waiting for a free pooled connection is bounded too.
            timeout=timeout_s,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            # No retries inside redis-py: see the module docstring. A pooled connection that
            # died while idle is still replaced before use (the pool checks it on checkout).
            retry=Retry(NoBackoff(), 0),
            # RESP2 on purpose: with RESP3, redis-py 8 turns on "maintenance notifications",
            # which skips that checkout check, so the first call on each pooled connection
            # after a Redis restart would fail. RESP2 also behaves alike across redis-py 5-8.
            protocol=2,
            decode_responses=True,
        )
        self._client = Redis(connection_pool=self._pool)
        register = self._client.register_script
        self._update_model_script = register(_UPDATE_MODEL)
        self._delete_model_script = register(_DELETE_MODEL)
        self._remove_worker_script = register(_REMOVE_WORKER)
        self._add_placement_script = register(_ADD_PLACEMENT)
        self._remove_placement_script = register(_REMOVE_PLACEMENT)
        self._request_activation_script = register(_REQUEST_ACTIVATION)
        self._pending_activations_script = register(_PENDING_ACTIVATIONS)
        self._report_first_response_script = register(_REPORT_FIRST_RESPONSE)
        self._kept_first_responses_script = register(_KEPT_FIRST_RESPONSES)
        self._update_activation_script = register(_UPDATE_ACTIVATION)
        self._report_traffic_script = register(_REPORT_TRAFFIC)
        self._traffic_script = register(_TRAFFIC)
        self._renew_lease_script = register(_RENEW_LEASE)
        self._release_lease_script = register(_RELEASE_LEASE)
        self._closed = False
        self._closed_event = asyncio.Event()

    # ---- models ----
    async def create_model(self, record: ModelRecord) -> None:
        created = await self._run(
            "create_model",
            lambda: self._client.hsetnx(self._models_key, record.name, _dumps(record)),
            # A replay after a lost answer would find the record it wrote and report a conflict.
            replay_safe=False,
        )
        if not created:
            raise StoreConflictError(f"model {record.name!r} already exists")

    async def update_model(self, record: ModelRecord) -> None:
        updated = await self._run(
            "update_model",
            lambda: self._update_model_script(
                keys=[self._models_key], args=[record.name, _dumps(record)]
            ),
        )
        if not updated:
            raise StoreConflictError(f"model {record.name!r} does not exist")

    async def get_model(self, name: str) -> ModelRecord | None:
        raw = await self._run("get_model", lambda: self._client.hget(self._models_key, name))
        return None if raw is None else ModelRecord.from_json(orjson.loads(raw))

    async def list_models(self) -> list[ModelRecord]:
        raws = await self._run("list_models", lambda: self._client.hvals(self._models_key))
        records = [ModelRecord.from_json(orjson.loads(raw)) for raw in raws]
        return sorted(records, key=lambda r: r.name)

    async def delete_model(self, name: str) -> bool:
        # Placements, traffic and timelines go even when the record is already gone, so that
        # leftovers of a racing placer are cleaned up by deleting again.
        existed = await self._run(
            "delete_model",
            lambda: self._delete_model_script(
                keys=[
                    self._models_key,
                    self._placements_key,
                    self._timeline_key(name),
                    self._traffic_key(name),
                    self._traffic_expiry_key(name),
                    self._activation_requests_key,
                    self._sleeping_key,
                ],
                args=[name, self._placement_channel],
            ),
            # A replay after a lost answer would find nothing and report False.
            replay_safe=False,
        )
        return bool(existed)

    # ---- workers ----
    async def put_worker(self, worker: WorkerRecord) -> None:
        await self._run(
            "put_worker", lambda: self._client.hset(self._workers_key, worker.id, _dumps(worker))
        )

    async def remove_worker(self, worker_id: str) -> None:
        await self._run(
            "remove_worker",
            lambda: self._remove_worker_script(
                keys=[self._workers_key, self._placements_key, self._sleeping_key],
                args=[worker_id, self._placement_channel],
            ),
        )

    # ---- sleeping replicas ----
    async def put_sleeping(self, replica: Placement) -> None:
        field = _placement_field(replica.model, replica.worker_id)
        await self._run(
            "put_sleeping", lambda: self._client.hset(self._sleeping_key, field, _dumps(replica))
        )

    async def remove_sleeping(self, model: str, worker_id: str) -> bool:
        field = _placement_field(model, worker_id)
        removed = await self._run(
            "remove_sleeping",
            lambda: self._client.hdel(self._sleeping_key, field),
            # A replay after a lost answer would find nothing and report False.
            replay_safe=False,
        )
        return bool(removed)

    async def list_sleeping(self, model: str | None = None) -> list[Placement]:
        raws = await self._run("list_sleeping", lambda: self._client.hvals(self._sleeping_key))
        replicas = [Placement.from_json(orjson.loads(raw)) for raw in raws]
        return sorted(
            (p for p in replicas if model is None or p.model == model),
            key=lambda p: (p.model, p.worker_id),
        )

    async def list_workers(self) -> list[WorkerRecord]:
        raws = await self._run("list_workers", lambda: self._client.hvals(self._workers_key))
        workers = [WorkerRecord.from_json(orjson.loads(raw)) for raw in raws]
        return sorted(workers, key=lambda w: w.id)

    # ---- placements ----
    async def add_placement(self, placement: Placement) -> None:
        # A replay republishes ADDED; subscribers treat events as idempotent anyway.
        await self._run(
            "add_placement",
            lambda: self._add_placement_script(
                keys=[self._placements_key, self._activation_requests_key],
                args=[
                    _placement_field(placement.model, placement.worker_id),
                    _dumps(placement),
                    placement.model,
                    self._placement_channel,
                ],
            ),
        )

    async def remove_placement(self, model: str, worker_id: str) -> None:
        await self._run(
            "remove_placement",
            lambda: self._remove_placement_script(
                keys=[self._placements_key],
                args=[_placement_field(model, worker_id), self._placement_channel],
            ),
        )

    async def list_placements(self, model: str | None = None) -> list[Placement]:
        raws = await self._run("list_placements", lambda: self._client.hvals(self._placements_key))
        placements = [Placement.from_json(orjson.loads(raw)) for raw in raws]
        return sorted(
            (p for p in placements if model is None or p.model == model),
            key=lambda p: (p.model, p.worker_id),
        )

    def subscribe_placements(self) -> AsyncGenerator[PlacementEvent, None]:
        """Placement changes; see :meth:`StateStore.subscribe_placements`.

        Yields RESYNC each time the subscription is (re)established, once Redis has confirmed
        it, so state read after a RESYNC misses no change. While Redis is unreachable the
        iterator waits, reconnecting with backoff (logged), and does not raise. A subscriber
        that falls so far behind that Redis cuts it off (``client-output-buffer-limit
        pubsub``) reconnects the same way and gets RESYNC: nothing is lost silently.
        Iteration ends when the store is closed; a consumer that stops early should
        ``aclose()`` the iterator or cancel the task iterating it.
        """
        return self._listen(
            self._placement_channel, what="placements", on_connect=_resync, decode=_event
        )

    # ---- activation requests ----
    async def request_activation(self, model: str) -> None:
        """Publish a request for ``model`` unless one is pending.

        A request stays pending until a placement of the model is added, the model is deleted,
        or ``activation_pending_ttl_s`` passes (so a lost or failed activation is asked for
        again by the next request).
        """
        await self._run(
            "request_activation",
            lambda: self._request_activation_script(
                keys=[self._activation_requests_key],
                args=[model, self._activation_pending_ttl_ms, self._activation_channel],
            ),
        )

    def subscribe_activation_requests(self) -> AsyncGenerator[str, None]:
        """Requested model names, at least once each.

        Each time the subscription is (re)established it first yields every request pending
        then, so requests made while nobody listened, or during an outage, are not lost.
        Reconnects and ends like :meth:`subscribe_placements`.
        """
        return self._listen(
            self._activation_channel,
            what="activation requests",
            on_connect=self._pending_activations,
            decode=_model_name,
        )

    # ---- first responses ----
    async def report_first_response(self, report: FirstResponse) -> None:
        """Publish ``report`` and keep it for ``activation_pending_ttl_s``.

        A replay after a lost answer keeps the same report once and publishes it again;
        subscribers get first responses at least once anyway.
        """
        await self._run(
            "report_first_response",
            lambda: self._report_first_response_script(
                keys=[self._first_responses_key],
                args=[
                    _dumps(report),
                    self._activation_pending_ttl_ms,
                    self._first_response_channel,
                ],
            ),
        )

    def subscribe_first_responses(self) -> AsyncGenerator[FirstResponse, None]:
        """First responses, at least once each.

        Each time the subscription is (re)established it first yields every report kept
        then, oldest first. Reconnects and ends like :meth:`subscribe_placements`.
        """
        return self._listen(
            self._first_response_channel,
            what="first responses",
            on_connect=self._kept_first_responses,
            decode=_first_response,
        )

    # ---- traffic ----
    async def report_traffic(self, report: TrafficReport) -> None:
        await self._run(
            "report_traffic",
            lambda: self._report_traffic_script(
                keys=[self._traffic_key(report.model), self._traffic_expiry_key(report.model)],
                args=[report.activator_id, _dumps(report), self._traffic_ttl_ms],
            ),
        )

    async def traffic(self, model: str) -> list[TrafficReport]:
        """The latest unexpired report of each activator for ``model``, by activator id."""
        raws = await self._run(
            "traffic",
            lambda: self._traffic_script(
                keys=[self._traffic_key(model), self._traffic_expiry_key(model)]
            ),
        )
        reports = [TrafficReport.from_json(orjson.loads(raw)) for raw in raws]
        return sorted(reports, key=lambda r: r.activator_id)

    # ---- activation timelines ----
    async def add_activation(self, model: str, timeline: dict[str, Any], *, keep: int) -> None:
        """Append a cold-start timeline, keeping the newest ``keep`` (>= 1, else ValueError)."""
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        raw = orjson.dumps(timeline)
        key = self._timeline_key(model)

        async def push() -> None:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.lpush(key, raw)
                pipe.ltrim(key, 0, keep - 1)
                await pipe.execute()

        # A replay after a lost answer would store the timeline twice.
        await self._run("add_activation", push, replay_safe=False)

    async def update_activation(self, model: str, timeline: dict[str, Any]) -> bool:
        timeline_id = timeline.get("id")
        if not isinstance(timeline_id, str):
            raise ValueError(f"a timeline to update needs a str id, got {timeline_id!r}")
        replaced = await self._run(
            "update_activation",
            lambda: self._update_activation_script(
                keys=[self._timeline_key(model)], args=[timeline_id, orjson.dumps(timeline)]
            ),
        )
        return bool(replaced)

    async def list_activations(self, model: str) -> list[dict[str, Any]]:
        raws = await self._run(
            "list_activations", lambda: self._client.lrange(self._timeline_key(model), 0, -1)
        )
        return [orjson.loads(raw) for raw in raws]

    # ---- lease ----
    async def try_acquire_lease(self, holder: str, ttl_s: float) -> bool:
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        ttl_ms = _to_ms(ttl_s)

        async def acquire() -> bool:
            if await self._client.set(self._lease_key, holder, nx=True, px=ttl_ms):
                return True
            renewed = await self._renew_lease_script(keys=[self._lease_key], args=[holder, ttl_ms])
            return bool(renewed)

        # A replay finds the lease held by ``holder`` and renews it: the same answer.
        return await self._run("try_acquire_lease", acquire)

    async def release_lease(self, holder: str) -> None:
        """Give the lease up if ``holder`` has it; a no-op otherwise."""
        await self._run(
            "release_lease",
            lambda: self._release_lease_script(keys=[self._lease_key], args=[holder]),
        )

    async def close(self) -> None:
        """Make every later call raise StoreUnavailableError and end every subscription.

        Idempotent, and bounded by ``timeout_s`` even while Redis is unreachable.
        """
        if self._closed:
            return
        self._closed = True
        self._closed_event.set()
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._client.aclose()
                # Closes in-use connections too, which ends open subscriptions promptly.
                await self._pool.aclose()
        except _CLOSE_ERRORS as exc:
            # Nothing is left to do with a connection that cannot even be closed cleanly.
            logger.debug("closing the connections to %s failed: %r", self._address, exc)

    # ---- helpers ----
    async def _run(
        self, operation: str, call: Callable[[], Awaitable[_T]], *, replay_safe: bool = True
    ) -> _T:
        """``call()`` within ``timeout_s``, an outage turned into StoreUnavailableError.

        A call whose replay cannot change its outcome is tried once more, within the same
        timeout, after a connection error: a pooled connection may have died while idle (a
        Redis restart or failover drops them all), and some redis-py versions hand such a
        connection out. The retry gets a fresh one.
        """
        if self._closed:
            raise StoreUnavailableError(store=self._address, operation=operation, reason="closed")
        try:
            async with asyncio.timeout(self._timeout_s) as deadline:
                try:
                    return await call()
                except redis.exceptions.ConnectionError:
                    # Past the deadline, the retry would run unbounded: asyncio.timeout cancels
                    # once, and some redis-py versions turn that cancellation into a
                    # ConnectionError ("No connection available.").
                    if not replay_safe or deadline.expired():
                        raise
                    logger.debug("%s: connection error, trying once more", operation)
                    return await call()
        except TimeoutError as exc:
            reason = f"no answer within {self._timeout_s} s"
            raise StoreUnavailableError(
                store=self._address, operation=operation, reason=reason
            ) from exc
        except _OUTAGE_ERRORS as exc:
            raise StoreUnavailableError(
                store=self._address, operation=operation, reason=str(exc) or type(exc).__name__
            ) from exc

    async def _listen(
        self,
        channel: str,
        *,
        what: str,
        on_connect: Callable[[], Awaitable[list[_T]]],
        decode: Callable[[str], _T | None],
    ) -> AsyncGenerator[_T, None]:
        """Messages on ``channel``, decoded, surviving reconnects.

        After every (re)subscription, confirmed by Redis, first yields what ``on_connect``
        returns, which tells the consumer to catch up on what it may have missed.
        """
        failures = 0
        delay_s = 0.0
        while not self._closed:
            pubsub = self._client.pubsub()
            try:
                async with asyncio.timeout(self._timeout_s):
                    await pubsub.subscribe(channel)
                    # Wait for Redis's confirmation: only then will a change made after the
                    # consumer's catch-up read be delivered here.
                    while (await pubsub.get_message(timeout=self._timeout_s)) is None:
                        pass
                    catch_up = await on_connect()
                if failures:
                    logger.info(
                        "%s subscription reconnected to %s after %d failed attempts",
                        what,
                        self._address,
                        failures,
                        extra={"channel": channel, "failures": failures},
                    )
                failures = 0
                for item in catch_up:
                    yield item
                async with contextlib.aclosing(self._messages(pubsub)) as messages:
                    async for data in messages:
                        decoded = decode(data)
                        if decoded is not None:
                            yield decoded
                return  # only when the store closed
            except _SUBSCRIPTION_ERRORS as exc:
                if self._closed:
                    return
                failures += 1
                delay_s = self._backoff_s(failures)
                logger.warning(
                    "%s subscription to %s failed (attempt %d): %s; reconnecting in %.2f s",
                    what,
                    self._address,
                    failures,
                    str(exc) or type(exc).__name__,
                    delay_s,
                    extra={"channel": channel, "failures": failures},
                )
            finally:
                await self._close_pubsub(pubsub)
            # Sleep, but wake at once when the store closes.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay_s):
                    await self._closed_event.wait()

    async def _messages(self, pubsub: PubSub) -> AsyncGenerator[str, None]:
        """Payloads arriving on ``pubsub`` until the store closes; raises when Redis is gone.

        Pings when idle for ``keepalive_s``: a connection whose server vanished without
        closing it would otherwise look like a quiet channel forever.
        """
        loop = asyncio.get_running_loop()
        last_heard = loop.time()
        ping_sent_at: float | None = None
        while not self._closed:
            async with asyncio.timeout(self._poll_s + self._timeout_s):
                message = await pubsub.get_message(
                    ignore_subscribe_messages=True, timeout=self._poll_s
                )
            now = loop.time()
            if message is not None:
                last_heard, ping_sent_at = now, None
                if message["type"] == "message":
                    yield _text(message["data"])
            elif ping_sent_at is not None:
                if now - ping_sent_at > self._timeout_s:
                    raise TimeoutError(f"no answer to a keepalive ping within {self._timeout_s} s")
            elif now - last_heard >= self._keepalive_s:
                async with asyncio.timeout(self._timeout_s):
                    await pubsub.ping()
                ping_sent_at = now

    async def _close_pubsub(self, pubsub: PubSub) -> None:
        try:
            async with asyncio.timeout(self._timeout_s):
                await pubsub.aclose()  # type: ignore[no-untyped-call]
        except _CLOSE_ERRORS as exc:
            # The connection is usually broken already; it is dropped either way.
            logger.debug("closing a subscription connection failed: %r", exc)

    async def _pending_activations(self) -> list[str]:
        names = await self._pending_activations_script(keys=[self._activation_requests_key])
        return [_text(name) for name in names]

    async def _kept_first_responses(self) -> list[FirstResponse]:
        raws = await self._kept_first_responses_script(keys=[self._first_responses_key])
        reports = (_first_response(_text(raw)) for raw in raws)
        return [report for report in reports if report is not None]

    def _backoff_s(self, failures: int) -> float:
        # Capped exponential backoff with jitter, so replicas that lost Redis together do
        # not all come back in the same instant.
        ceiling = min(self._backoff_max_s, self._backoff_initial_s * 2 ** min(failures - 1, 30))
        return random.uniform(ceiling / 2, ceiling)

    def _timeline_key(self, model: str) -> str:
        return f"{self._prefix}timeline:{model}"

    def _traffic_key(self, model: str) -> str:
        return f"{self._prefix}traffic:{model}"

    def _traffic_expiry_key(self, model: str) -> str:
        return f"{self._prefix}traffic-expiry:{model}"


def _dumps(
    record: ModelRecord | WorkerRecord | Placement | TrafficReport | FirstResponse,
) -> bytes:
    return orjson.dumps(record.to_json())


def _placement_field(model: str, worker_id: str) -> str:
    # JSON keeps the pair unambiguous whatever characters the names hold.
    return orjson.dumps([model, worker_id]).decode()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _to_ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


async def _resync() -> list[PlacementEvent]:
    return [_RESYNC]


def _event(data: str) -> PlacementEvent | None:
    try:
        doc = orjson.loads(data)
        return PlacementEvent(
            PlacementEventKind(doc["kind"]), Placement.from_json(doc["placement"])
        )
    except (ValueError, KeyError, TypeError):
        # Someone else published on our channel; dropping it loses nothing of ours.
        logger.warning("ignoring a malformed placement event: %.200r", data)
        return None


def _first_response(data: str) -> FirstResponse | None:
    try:
        return FirstResponse.from_json(orjson.loads(data))
    except (ValueError, TypeError):
        logger.warning("ignoring a malformed first response: %.200r", data)
        return None


def _model_name(data: str) -> str:
    return data


def _redact(url: str) -> str:
    """``url`` without its password, fit for logs and error messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + host))
