"""The state store for the embedded platform: plain dicts on one asyncio event loop.

Every method runs to completion without awaiting, so each is atomic with respect to the other
tasks on the loop and no lock is needed. The store is not thread-safe: use it from the loop
that runs the control plane only.

Values are kept as their JSON, as Redis keeps them: what a caller gets back is a copy it may
change freely, and a record that would not survive the Redis store fails here too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import orjson

from control_plane.store.base import StateStore, StoreConflictError
from control_plane.store.errors import StoreUnavailableError
from foundation.keys import ALL_KEYS, ApiKeyRecord
from foundation.records import (
    FirstResponse,
    ModelRecord,
    Placement,
    PlacementEvent,
    PlacementEventKind,
    TrafficReport,
    WorkerRecord,
)

__all__ = ["MemoryStateStore"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

_RESYNC = PlacementEvent(PlacementEventKind.RESYNC)


class _ReplayPending:
    """Queued for an activation or first-response subscriber that overflowed: yield every
    pending request or kept report."""


_REPLAY_PENDING = _ReplayPending()


class _Mailbox(Generic[_T]):
    """One subscriber's bounded queue.

    A put into a full mailbox does not drop the item silently: it throws away everything
    queued and leaves ``overflow`` instead, a marker that tells the subscriber to re-read the
    full state. The item itself is dropped too, because that re-read happens later and so
    already covers it.
    """

    def __init__(self, maxsize: int, overflow: _T) -> None:
        self._items: deque[_T] = deque()
        self._maxsize = maxsize
        self._overflow = overflow
        self._ready = asyncio.Event()
        self._closed = False

    def put(self, item: _T) -> bool:
        """Queue ``item``; False when the mailbox overflowed and holds only the marker now."""
        if self._closed:
            return True
        self._ready.set()
        if len(self._items) >= self._maxsize:
            self._items.clear()
            self._items.append(self._overflow)
            return False
        self._items.append(item)
        return True

    def close(self) -> None:
        self._closed = True
        self._ready.set()

    async def get(self) -> _T | None:
        """The next item, waiting for one; None once the mailbox is closed."""
        while not self._items and not self._closed:
            self._ready.clear()
            await self._ready.wait()
        if self._closed:
            return None
        return self._items.popleft()


@dataclass(slots=True)
class _Lease:
    holder: str
    expires_at: float


class MemoryStateStore(StateStore):
    """A :class:`StateStore` in this process's memory, for the embedded platform.

    Subscriptions get one bounded queue each (``subscriber_queue_max`` items). A subscriber
    that falls that far behind loses the queued events and gets one RESYNC event (placements)
    or a replay of every pending request or kept report (activations, first responses) in
    their place, never a silent gap.

    Parameters:
        subscriber_queue_max: the most events queued for one subscriber.
        traffic_ttl_s: a traffic report no longer counts this long after it was made.
        activation_pending_ttl_s: an activation request stays pending (and repeats of it are
            not published again) for this long, unless a placement of the model comes first;
            a first response is kept this long too.
        clock: seconds on a monotonic clock; tests inject a fake one.
    """

    def __init__(
        self,
        *,
        subscriber_queue_max: int = 1024,
        traffic_ttl_s: float = 30.0,
        activation_pending_ttl_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if subscriber_queue_max < 1:
            raise ValueError(f"subscriber_queue_max must be >= 1, got {subscriber_queue_max}")
        _check_positive(traffic_ttl_s=traffic_ttl_s)
        _check_positive(activation_pending_ttl_s=activation_pending_ttl_s)
        self._subscriber_queue_max = subscriber_queue_max
        self._traffic_ttl_s = traffic_ttl_s
        self._activation_pending_ttl_s = activation_pending_ttl_s
        self._clock = clock
        self._closed = False
        self._models: dict[str, bytes] = {}
        self._workers: dict[str, bytes] = {}
        self._placements: dict[tuple[str, str], bytes] = {}
        self._sleeping: dict[tuple[str, str], bytes] = {}
        # model -> when its pending activation request lapses (clock seconds)
        self._pending: dict[str, float] = {}
        # first-response JSON -> when it lapses (clock seconds)
        self._first_responses: dict[bytes, float] = {}
        # model -> activator id -> (report JSON, when it lapses)
        self._traffic: dict[str, dict[str, tuple[bytes, float]]] = {}
        # model -> timelines, newest first
        self._timelines: dict[str, deque[bytes]] = {}
        self._model_state: dict[str, dict[str, bytes]] = {}
        """model -> key -> JSON doc (what keep-alive policies learn)."""
        self._lease: _Lease | None = None
        self._keys: dict[str, bytes] = {}
        self._revocation_boxes: set[_Mailbox[str]] = set()
        self._placement_boxes: set[_Mailbox[PlacementEvent]] = set()
        self._activation_boxes: set[_Mailbox[str | _ReplayPending]] = set()
        self._first_response_boxes: set[_Mailbox[FirstResponse | _ReplayPending]] = set()

    # ---- models ----
    async def create_model(self, record: ModelRecord) -> None:
        self._check_open("create_model")
        if record.name in self._models:
            raise StoreConflictError(f"model {record.name!r} already exists")
        self._models[record.name] = orjson.dumps(record.to_json())

    async def update_model(
        self, record: ModelRecord, *, expected_generation: int | None = None
    ) -> None:
        self._check_open("update_model")
        current = self._models.get(record.name)
        if current is None:
            raise StoreConflictError(f"model {record.name!r} does not exist")
        if (
            expected_generation is not None
            and orjson.loads(current)["generation"] != expected_generation
        ):
            raise StoreConflictError(
                f"model {record.name!r} does not exist at generation {expected_generation}"
            )
        self._models[record.name] = orjson.dumps(record.to_json())

    async def get_model(self, name: str) -> ModelRecord | None:
        self._check_open("get_model")
        raw = self._models.get(name)
        return None if raw is None else ModelRecord.from_json(orjson.loads(raw))

    async def list_models(self) -> list[ModelRecord]:
        self._check_open("list_models")
        return [ModelRecord.from_json(orjson.loads(self._models[n])) for n in sorted(self._models)]

    async def delete_model(self, name: str) -> bool:
        self._check_open("delete_model")
        existed = self._models.pop(name, None) is not None
        # Placements, traffic and timelines go even when the record is already gone, so that
        # leftovers of a racing placer are cleaned up by deleting again.
        for key in [k for k in self._placements if k[0] == name]:
            self._publish_removed(self._placements.pop(key))
        for key in [k for k in self._sleeping if k[0] == name]:
            del self._sleeping[key]
        self._traffic.pop(name, None)
        self._timelines.pop(name, None)
        self._pending.pop(name, None)
        self._model_state.pop(name, None)
        return existed

    # ---- workers ----
    async def put_worker(self, worker: WorkerRecord) -> None:
        self._check_open("put_worker")
        self._workers[worker.id] = orjson.dumps(worker.to_json())

    async def remove_worker(self, worker_id: str) -> None:
        self._check_open("remove_worker")
        self._workers.pop(worker_id, None)
        for key in [k for k in self._placements if k[1] == worker_id]:
            self._publish_removed(self._placements.pop(key))
        for key in [k for k in self._sleeping if k[1] == worker_id]:
            del self._sleeping[key]

    # ---- sleeping replicas ----
    async def put_sleeping(self, replica: Placement) -> None:
        self._check_open("put_sleeping")
        self._sleeping[(replica.model, replica.worker_id)] = orjson.dumps(replica.to_json())

    async def remove_sleeping(self, model: str, worker_id: str) -> bool:
        self._check_open("remove_sleeping")
        return self._sleeping.pop((model, worker_id), None) is not None

    async def list_sleeping(self, model: str | None = None) -> list[Placement]:
        self._check_open("list_sleeping")
        return [
            Placement.from_json(orjson.loads(self._sleeping[key]))
            for key in sorted(self._sleeping)
            if model is None or key[0] == model
        ]

    async def list_workers(self) -> list[WorkerRecord]:
        self._check_open("list_workers")
        return [
            WorkerRecord.from_json(orjson.loads(self._workers[i])) for i in sorted(self._workers)
        ]

    # ---- placements ----
    async def add_placement(self, placement: Placement) -> None:
        self._check_open("add_placement")
        raw = orjson.dumps(placement.to_json())
        self._placements[(placement.model, placement.worker_id)] = raw
        # The model is up, so a request to activate it is no longer pending.
        self._pending.pop(placement.model, None)
        self._publish(PlacementEvent(PlacementEventKind.ADDED, _placement(raw)))

    async def remove_placement(self, model: str, worker_id: str) -> None:
        self._check_open("remove_placement")
        raw = self._placements.pop((model, worker_id), None)
        if raw is not None:
            self._publish_removed(raw)

    async def list_placements(self, model: str | None = None) -> list[Placement]:
        self._check_open("list_placements")
        return [
            _placement(self._placements[key])
            for key in sorted(self._placements)
            if model is None or key[0] == model
        ]

    async def subscribe_placements(self) -> AsyncGenerator[PlacementEvent, None]:
        """Placement changes; see :meth:`StateStore.subscribe_placements`.

        The subscription is in place when the first event (RESYNC) is returned, so state read
        after it misses no change. Iteration ends when the store is closed; a consumer that
        stops early should ``aclose()`` the iterator or cancel the task iterating it.
        """
        if self._closed:
            return
        box: _Mailbox[PlacementEvent] = _Mailbox(self._subscriber_queue_max, _RESYNC)
        self._placement_boxes.add(box)
        try:
            yield _RESYNC
            while (event := await box.get()) is not None:
                yield event
        finally:
            self._placement_boxes.discard(box)

    # ---- activation requests ----
    async def request_activation(self, model: str) -> None:
        """Publish a request for ``model`` unless one is pending.

        A request stays pending until a placement of the model is added, the model is deleted,
        or ``activation_pending_ttl_s`` passes (so a lost or failed activation is asked for
        again by the next request).
        """
        self._check_open("request_activation")
        now = self._clock()
        expires_at = self._pending.get(model)
        if expires_at is not None and expires_at > now:
            return
        self._pending[model] = now + self._activation_pending_ttl_s
        for box in self._activation_boxes:
            if not box.put(model):
                logger.warning(
                    "an activation-request subscriber fell behind; it will get a replay",
                    extra={"subscriber_queue_max": self._subscriber_queue_max},
                )

    async def subscribe_activation_requests(self) -> AsyncGenerator[str, None]:
        """Requested model names, at least once each.

        Starts with every request that is pending now (one made while nobody listened is not
        lost), then new requests as they come. The subscription is in place when the first
        name is returned; iteration ends when the store is closed.
        """
        if self._closed:
            return
        box: _Mailbox[str | _ReplayPending] = _Mailbox(self._subscriber_queue_max, _REPLAY_PENDING)
        self._activation_boxes.add(box)
        try:
            # Registering and taking the snapshot happen without an await in between, so a
            # request is either in the snapshot or in the mailbox, never in neither.
            item: str | _ReplayPending | None = _REPLAY_PENDING
            while item is not None:
                if isinstance(item, _ReplayPending):
                    for model in self._pending_models():
                        yield model
                else:
                    yield item
                item = await box.get()
        finally:
            self._activation_boxes.discard(box)

    # ---- first responses ----
    async def report_first_response(self, report: FirstResponse) -> None:
        """Publish ``report`` and keep it for ``activation_pending_ttl_s``."""
        self._check_open("report_first_response")
        self._drop_lapsed_first_responses()
        self._first_responses[orjson.dumps(report.to_json())] = (
            self._clock() + self._activation_pending_ttl_s
        )
        for box in self._first_response_boxes:
            if not box.put(report):
                logger.warning(
                    "a first-response subscriber fell behind; it will get a replay",
                    extra={"subscriber_queue_max": self._subscriber_queue_max},
                )

    async def subscribe_first_responses(self) -> AsyncGenerator[FirstResponse, None]:
        """First responses, at least once each.

        Starts with every report kept now, oldest first, then new ones as they come. The
        subscription is in place when the first report is returned; iteration ends when the
        store is closed.
        """
        if self._closed:
            return
        box: _Mailbox[FirstResponse | _ReplayPending] = _Mailbox(
            self._subscriber_queue_max, _REPLAY_PENDING
        )
        self._first_response_boxes.add(box)
        try:
            # As for activation requests: no await between registering and the snapshot.
            item: FirstResponse | _ReplayPending | None = _REPLAY_PENDING
            while item is not None:
                if isinstance(item, _ReplayPending):
                    for report in self._kept_first_responses():
                        yield report
                else:
                    yield item
                item = await box.get()
        finally:
            self._first_response_boxes.discard(box)

    # ---- traffic ----
    async def report_traffic(self, report: TrafficReport) -> None:
        self._check_open("report_traffic")
        expires_at = self._clock() + self._traffic_ttl_s
        reports = self._traffic.setdefault(report.model, {})
        reports[report.activator_id] = (orjson.dumps(report.to_json()), expires_at)

    async def traffic(self, model: str) -> list[TrafficReport]:
        """The latest unexpired report of each activator for ``model``, by activator id."""
        self._check_open("traffic")
        reports = self._traffic.get(model)
        if not reports:
            return []
        now = self._clock()
        for activator in [a for a, (_, exp) in reports.items() if exp <= now]:
            del reports[activator]
        if not reports:
            del self._traffic[model]
            return []
        return [TrafficReport.from_json(orjson.loads(reports[a][0])) for a in sorted(reports)]

    # ---- activation timelines ----
    async def add_activation(self, model: str, timeline: dict[str, Any], *, keep: int) -> None:
        """Append a cold-start timeline, keeping the newest ``keep`` (>= 1, else ValueError)."""
        self._check_open("add_activation")
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        timelines = self._timelines.setdefault(model, deque())
        timelines.appendleft(orjson.dumps(timeline))
        while len(timelines) > keep:
            timelines.pop()

    async def update_activation(self, model: str, timeline: dict[str, Any]) -> bool:
        self._check_open("update_activation")
        timeline_id = _timeline_id(timeline)
        timelines = self._timelines.get(model)
        if timelines is None:
            return False
        for index, raw in enumerate(timelines):
            if orjson.loads(raw).get("id") == timeline_id:
                timelines[index] = orjson.dumps(timeline)
                return True
        return False

    async def list_activations(self, model: str) -> list[dict[str, Any]]:
        self._check_open("list_activations")
        return [orjson.loads(raw) for raw in self._timelines.get(model, ())]

    # ---- API keys ----
    async def create_key(self, record: ApiKeyRecord) -> None:
        self._check_open("create_key")
        if record.id in self._keys:
            raise StoreConflictError(f"key {record.id!r} already exists")
        self._keys[record.id] = orjson.dumps(record.to_json())

    async def get_key(self, key_id: str) -> ApiKeyRecord | None:
        self._check_open("get_key")
        raw = self._keys.get(key_id)
        return None if raw is None else ApiKeyRecord.from_json(orjson.loads(raw))

    async def list_keys(self) -> list[ApiKeyRecord]:
        self._check_open("list_keys")
        return [ApiKeyRecord.from_json(orjson.loads(self._keys[i])) for i in sorted(self._keys)]

    async def revoke_key(self, key_id: str, *, revoked_at: float) -> ApiKeyRecord | None:
        self._check_open("revoke_key")
        raw = self._keys.get(key_id)
        if raw is None:
            return None
        record = ApiKeyRecord.from_json(orjson.loads(raw))
        if record.revoked_at is None:
            record = dataclasses.replace(record, revoked_at=revoked_at)
            self._keys[key_id] = orjson.dumps(record.to_json())
        for box in self._revocation_boxes:
            box.put(key_id)
        return record

    async def subscribe_key_revocations(self) -> AsyncGenerator[str, None]:
        """Revoked key ids; see :meth:`StateStore.subscribe_key_revocations`. In place when
        the first item (``ALL_KEYS``) is returned; ends when the store is closed."""
        if self._closed:
            return
        box: _Mailbox[str] = _Mailbox(self._subscriber_queue_max, ALL_KEYS)
        self._revocation_boxes.add(box)
        try:
            yield ALL_KEYS
            while (key_id := await box.get()) is not None:
                yield key_id
        finally:
            self._revocation_boxes.discard(box)

    # ---- per-model control state ----
    async def put_model_state(self, model: str, key: str, doc: dict[str, Any]) -> None:
        self._check_open("put_model_state")
        self._model_state.setdefault(model, {})[key] = orjson.dumps(doc)

    async def get_model_state(self, model: str, key: str) -> dict[str, Any] | None:
        self._check_open("get_model_state")
        raw = self._model_state.get(model, {}).get(key)
        return None if raw is None else orjson.loads(raw)

    # ---- lease ----
    async def try_acquire_lease(self, holder: str, ttl_s: float) -> bool:
        self._check_open("try_acquire_lease")
        _check_positive(ttl_s=ttl_s)
        now = self._clock()
        lease = self._lease
        if lease is not None and lease.holder != holder and lease.expires_at > now:
            return False
        self._lease = _Lease(holder, now + ttl_s)
        return True

    async def release_lease(self, holder: str) -> None:
        """Give the lease up if ``holder`` has it; a no-op otherwise."""
        self._check_open("release_lease")
        if self._lease is not None and self._lease.holder == holder:
            self._lease = None

    async def close(self) -> None:
        """Make every later call raise StoreUnavailableError and end every subscription."""
        self._closed = True
        for placement_box in self._placement_boxes:
            placement_box.close()
        for activation_box in self._activation_boxes:
            activation_box.close()
        for first_response_box in self._first_response_boxes:
            first_response_box.close()
        for revocation_box in self._revocation_boxes:
            revocation_box.close()

    # ---- helpers ----
    def _check_open(self, operation: str) -> None:
        if self._closed:
            raise StoreUnavailableError(store="memory", operation=operation, reason="closed")

    def _pending_models(self) -> list[str]:
        now = self._clock()
        for model in [m for m, exp in self._pending.items() if exp <= now]:
            del self._pending[model]
        return sorted(self._pending)

    def _drop_lapsed_first_responses(self) -> None:
        now = self._clock()
        for raw in [r for r, exp in self._first_responses.items() if exp <= now]:
            del self._first_responses[raw]

    def _kept_first_responses(self) -> list[FirstResponse]:
        self._drop_lapsed_first_responses()
        by_expiry = sorted(self._first_responses.items(), key=lambda item: item[1])
        return [FirstResponse.from_json(orjson.loads(raw)) for raw, _ in by_expiry]

    def _publish_removed(self, raw: bytes) -> None:
        self._publish(PlacementEvent(PlacementEventKind.REMOVED, _placement(raw)))

    def _publish(self, event: PlacementEvent) -> None:
        for box in self._placement_boxes:
            if not box.put(event):
                logger.warning(
                    "a placement subscriber fell behind; it will get RESYNC",
                    extra={"subscriber_queue_max": self._subscriber_queue_max},
                )


def _placement(raw: bytes) -> Placement:
    return Placement.from_json(orjson.loads(raw))


def _timeline_id(timeline: dict[str, Any]) -> str:
    timeline_id = timeline.get("id")
    if not isinstance(timeline_id, str):
        raise ValueError(f"a timeline to update needs a str id, got {timeline_id!r}")
    return timeline_id


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value}")
