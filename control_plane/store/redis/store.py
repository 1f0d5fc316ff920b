"""The state store for the cluster: one Redis (ElastiCache) shared by every replica.

What lives under which key, and the Lua scripts that change several keys in one atomic step,
are in ``scripts``; subscriptions to the store's channels are in ``subscriptions``.

Failure: every call is bounded by ``timeout_s`` and raises ``StoreUnavailableError`` when
Redis cannot be reached or does not answer in time. redis-py itself never retries (see
``connection``). The store retries once, after a connection error, only calls whose replay
gives the same outcome. Subscriptions reconnect on their own, with capped exponential
backoff, and announce every reconnect to their consumer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import orjson

from control_plane.store.base import StateStore, StoreConflictError
from control_plane.store.errors import StoreUnavailableError
from control_plane.store.redis.connection import (
    CLOSE_ERRORS,
    bounded,
    open_client,
    redact,
    text,
)
from control_plane.store.redis.scripts import Keys, Scripts
from control_plane.store.redis.subscriptions import (
    Subscriber,
    first_response,
    model_name,
    placement_event,
    resync,
)
from foundation.keys import ALL_KEYS, ApiKeyRecord
from foundation.records import (
    FirstResponse,
    ModelRecord,
    Placement,
    PlacementEvent,
    TrafficReport,
    WorkerRecord,
)

__all__ = ["RedisStateStore"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


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

        self._address = redact(url)
        self._timeout_s = timeout_s
        self._traffic_ttl_ms = _to_ms(traffic_ttl_s)
        self._activation_pending_ttl_ms = _to_ms(activation_pending_ttl_s)
        self._keys = Keys(key_prefix)
        self._pool, self._client = open_client(
            url, max_connections=max_connections, timeout_s=timeout_s
        )
        self._scripts = Scripts(self._client)
        self._closed = False
        self._closed_event = asyncio.Event()
        self._subscriber = Subscriber(
            self._client,
            address=self._address,
            timeout_s=timeout_s,
            keepalive_s=keepalive_s,
            backoff_initial_s=reconnect_backoff_initial_s,
            backoff_max_s=reconnect_backoff_max_s,
            closed=self._closed_event,
        )

    # ---- models ----
    async def create_model(self, record: ModelRecord) -> None:
        created = await self._run(
            "create_model",
            lambda: self._client.hsetnx(self._keys.models, record.name, _dumps(record)),
            # A replay after a lost answer would find the record it wrote and report a conflict.
            replay_safe=False,
        )
        if not created:
            raise StoreConflictError(f"model {record.name!r} already exists")

    async def update_model(
        self, record: ModelRecord, *, expected_generation: int | None = None
    ) -> None:
        expected = "" if expected_generation is None else str(expected_generation)
        updated = await self._run(
            "update_model",
            lambda: self._scripts.update_model(
                keys=[self._keys.models], args=[record.name, _dumps(record), expected]
            ),
        )
        if not updated:
            raise StoreConflictError(
                f"model {record.name!r} does not exist"
                if expected_generation is None
                else f"model {record.name!r} does not exist at generation {expected}"
            )

    async def get_model(self, name: str) -> ModelRecord | None:
        raw = await self._run("get_model", lambda: self._client.hget(self._keys.models, name))
        return None if raw is None else ModelRecord.from_json(orjson.loads(raw))

    async def list_models(self) -> list[ModelRecord]:
        raws = await self._run("list_models", lambda: self._client.hvals(self._keys.models))
        records = [ModelRecord.from_json(orjson.loads(raw)) for raw in raws]
        return sorted(records, key=lambda r: r.name)

    async def delete_model(self, name: str) -> bool:
        # Placements, traffic and timelines go even when the record is already gone, so that
        # leftovers of a racing placer are cleaned up by deleting again.
        existed = await self._run(
            "delete_model",
            lambda: self._scripts.delete_model(
                keys=[
                    self._keys.models,
                    self._keys.placements,
                    self._keys.timeline(name),
                    self._keys.traffic(name),
                    self._keys.traffic_expiry(name),
                    self._keys.activation_requests,
                    self._keys.sleeping,
                ],
                args=[name, self._keys.placement_channel],
            ),
            # A replay after a lost answer would find nothing and report False.
            replay_safe=False,
        )
        # Learned state is the model's too; after the record (a reaper that saw the model
        # just before it went would write it again, which the next delete cleans up).
        await self._run("delete_model", lambda: self._client.delete(self._keys.model_state(name)))
        return bool(existed)

    # ---- workers ----
    async def put_worker(self, worker: WorkerRecord) -> None:
        await self._run(
            "put_worker", lambda: self._client.hset(self._keys.workers, worker.id, _dumps(worker))
        )

    async def remove_worker(self, worker_id: str) -> None:
        await self._run(
            "remove_worker",
            lambda: self._scripts.remove_worker(
                keys=[self._keys.workers, self._keys.placements, self._keys.sleeping],
                args=[worker_id, self._keys.placement_channel],
            ),
        )

    # ---- sleeping replicas ----
    async def put_sleeping(self, replica: Placement) -> None:
        field = _placement_field(replica.model, replica.worker_id)
        await self._run(
            "put_sleeping", lambda: self._client.hset(self._keys.sleeping, field, _dumps(replica))
        )

    async def remove_sleeping(self, model: str, worker_id: str) -> bool:
        field = _placement_field(model, worker_id)
        removed = await self._run(
            "remove_sleeping",
            lambda: self._client.hdel(self._keys.sleeping, field),
            # A replay after a lost answer would find nothing and report False.
            replay_safe=False,
        )
        return bool(removed)

    async def list_sleeping(self, model: str | None = None) -> list[Placement]:
        raws = await self._run("list_sleeping", lambda: self._client.hvals(self._keys.sleeping))
        replicas = [Placement.from_json(orjson.loads(raw)) for raw in raws]
        return sorted(
            (p for p in replicas if model is None or p.model == model),
            key=lambda p: (p.model, p.worker_id),
        )

    async def list_workers(self) -> list[WorkerRecord]:
        raws = await self._run("list_workers", lambda: self._client.hvals(self._keys.workers))
        workers = [WorkerRecord.from_json(orjson.loads(raw)) for raw in raws]
        return sorted(workers, key=lambda w: w.id)

    # ---- placements ----
    async def add_placement(self, placement: Placement) -> None:
        # A replay republishes ADDED; subscribers treat events as idempotent anyway.
        await self._run(
            "add_placement",
            lambda: self._scripts.add_placement(
                keys=[self._keys.placements, self._keys.activation_requests],
                args=[
                    _placement_field(placement.model, placement.worker_id),
                    _dumps(placement),
                    placement.model,
                    self._keys.placement_channel,
                ],
            ),
        )

    async def remove_placement(self, model: str, worker_id: str) -> None:
        await self._run(
            "remove_placement",
            lambda: self._scripts.remove_placement(
                keys=[self._keys.placements],
                args=[_placement_field(model, worker_id), self._keys.placement_channel],
            ),
        )

    async def list_placements(self, model: str | None = None) -> list[Placement]:
        raws = await self._run("list_placements", lambda: self._client.hvals(self._keys.placements))
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
        return self._subscriber.listen(
            self._keys.placement_channel,
            what="placements",
            on_connect=resync,
            decode=placement_event,
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
            lambda: self._scripts.request_activation(
                keys=[self._keys.activation_requests],
                args=[model, self._activation_pending_ttl_ms, self._keys.activation_channel],
            ),
        )

    def subscribe_activation_requests(self) -> AsyncGenerator[str, None]:
        """Requested model names, at least once each.

        Each time the subscription is (re)established it first yields every request pending
        then, so requests made while nobody listened, or during an outage, are not lost.
        Reconnects and ends like :meth:`subscribe_placements`.
        """
        return self._subscriber.listen(
            self._keys.activation_channel,
            what="activation requests",
            on_connect=self._pending_activations,
            decode=model_name,
        )

    # ---- first responses ----
    async def report_first_response(self, report: FirstResponse) -> None:
        """Publish ``report`` and keep it for ``activation_pending_ttl_s``.

        A replay after a lost answer keeps the same report once and publishes it again;
        subscribers get first responses at least once anyway.
        """
        await self._run(
            "report_first_response",
            lambda: self._scripts.report_first_response(
                keys=[self._keys.first_responses],
                args=[
                    _dumps(report),
                    self._activation_pending_ttl_ms,
                    self._keys.first_response_channel,
                ],
            ),
        )

    def subscribe_first_responses(self) -> AsyncGenerator[FirstResponse, None]:
        """First responses, at least once each.

        Each time the subscription is (re)established it first yields every report kept
        then, oldest first. Reconnects and ends like :meth:`subscribe_placements`.
        """
        return self._subscriber.listen(
            self._keys.first_response_channel,
            what="first responses",
            on_connect=self._kept_first_responses,
            decode=first_response,
        )

    # ---- traffic ----
    async def report_traffic(self, report: TrafficReport) -> None:
        await self._run(
            "report_traffic",
            lambda: self._scripts.report_traffic(
                keys=[self._keys.traffic(report.model), self._keys.traffic_expiry(report.model)],
                args=[report.activator_id, _dumps(report), self._traffic_ttl_ms],
            ),
        )

    async def traffic(self, model: str) -> list[TrafficReport]:
        """The latest unexpired report of each activator for ``model``, by activator id."""
        raws = await self._run(
            "traffic",
            lambda: self._scripts.traffic(
                keys=[self._keys.traffic(model), self._keys.traffic_expiry(model)]
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
        key = self._keys.timeline(model)

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
            lambda: self._scripts.update_activation(
                keys=[self._keys.timeline(model)], args=[timeline_id, orjson.dumps(timeline)]
            ),
        )
        return bool(replaced)

    async def list_activations(self, model: str) -> list[dict[str, Any]]:
        raws = await self._run(
            "list_activations", lambda: self._client.lrange(self._keys.timeline(model), 0, -1)
        )
        return [orjson.loads(raw) for raw in raws]

    # ---- API keys ----
    async def create_key(self, record: ApiKeyRecord) -> None:
        created = await self._run(
            "create_key",
            lambda: self._client.hsetnx(self._keys.api_keys, record.id, _dumps(record)),
            # A replay after a lost answer would find the record it wrote and report a conflict.
            replay_safe=False,
        )
        if not created:
            raise StoreConflictError(f"key {record.id!r} already exists")

    async def get_key(self, key_id: str) -> ApiKeyRecord | None:
        raw = await self._run("get_key", lambda: self._client.hget(self._keys.api_keys, key_id))
        return None if raw is None else ApiKeyRecord.from_json(orjson.loads(raw))

    async def list_keys(self) -> list[ApiKeyRecord]:
        raws = await self._run("list_keys", lambda: self._client.hvals(self._keys.api_keys))
        records = [ApiKeyRecord.from_json(orjson.loads(raw)) for raw in raws]
        return sorted(records, key=lambda r: r.id)

    async def revoke_key(self, key_id: str, *, revoked_at: float) -> ApiKeyRecord | None:
        record = await self.get_key(key_id)
        if record is None:
            return None
        if record.revoked_at is None:
            record = dataclasses.replace(record, revoked_at=revoked_at)
        # Keys change only by being revoked, so writing the record read above loses nothing;
        # the script publishes in the same step, and only while the key still exists.
        stored = await self._run(
            "revoke_key",
            lambda: self._scripts.revoke_key(
                keys=[self._keys.api_keys],
                args=[key_id, _dumps(record), self._keys.key_revocation_channel],
            ),
        )
        return record if stored else None

    def subscribe_key_revocations(self) -> AsyncGenerator[str, None]:
        """Revoked key ids; after every (re)subscription first ``ALL_KEYS`` (revocations
        made during an outage are not replayed, so consumers forget every cached key).
        Reconnects and ends like :meth:`subscribe_placements`."""
        return self._subscriber.listen(
            self._keys.key_revocation_channel,
            what="key revocations",
            on_connect=_forget_all_keys,
            decode=model_name,
        )

    # ---- per-model control state ----
    async def put_model_state(self, model: str, key: str, doc: dict[str, Any]) -> None:
        await self._run(
            "put_model_state",
            lambda: self._client.hset(self._keys.model_state(model), key, orjson.dumps(doc)),
        )

    async def get_model_state(self, model: str, key: str) -> dict[str, Any] | None:
        raw = await self._run(
            "get_model_state", lambda: self._client.hget(self._keys.model_state(model), key)
        )
        return None if raw is None else dict(orjson.loads(raw))

    # ---- lease ----
    async def try_acquire_lease(self, holder: str, ttl_s: float) -> bool:
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        ttl_ms = _to_ms(ttl_s)

        async def acquire() -> bool:
            if await self._client.set(self._keys.lease, holder, nx=True, px=ttl_ms):
                return True
            renewed = await self._scripts.renew_lease(
                keys=[self._keys.lease], args=[holder, ttl_ms]
            )
            return bool(renewed)

        # A replay finds the lease held by ``holder`` and renews it: the same answer.
        return await self._run("try_acquire_lease", acquire)

    async def release_lease(self, holder: str) -> None:
        """Give the lease up if ``holder`` has it; a no-op otherwise."""
        await self._run(
            "release_lease",
            lambda: self._scripts.release_lease(keys=[self._keys.lease], args=[holder]),
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
        except CLOSE_ERRORS as exc:
            # Nothing is left to do with a connection that cannot even be closed cleanly.
            logger.debug("closing the connections to %s failed: %r", self._address, exc)

    # ---- helpers ----
    async def _run(
        self, operation: str, call: Callable[[], Awaitable[_T]], *, replay_safe: bool = True
    ) -> _T:
        """``call()`` within ``timeout_s`` (see ``connection.bounded``); StoreUnavailableError
        once the store is closed."""
        if self._closed:
            raise StoreUnavailableError(store=self._address, operation=operation, reason="closed")
        return await bounded(
            call,
            store=self._address,
            operation=operation,
            timeout_s=self._timeout_s,
            replay_safe=replay_safe,
        )

    async def _pending_activations(self) -> list[str]:
        names = await self._scripts.pending_activations(keys=[self._keys.activation_requests])
        return [text(name) for name in names]

    async def _kept_first_responses(self) -> list[FirstResponse]:
        raws = await self._scripts.kept_first_responses(keys=[self._keys.first_responses])
        reports = (first_response(text(raw)) for raw in raws)
        return [report for report in reports if report is not None]


async def _forget_all_keys() -> list[str]:
    return [ALL_KEYS]


def _dumps(
    record: ModelRecord | WorkerRecord | Placement | TrafficReport | FirstResponse | ApiKeyRecord,
) -> bytes:
    return orjson.dumps(record.to_json())


def _placement_field(model: str, worker_id: str) -> str:
    # JSON keeps the pair unambiguous whatever characters the names hold.
    return orjson.dumps([model, worker_id]).decode()


def _to_ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))
