"""The StateStore contract, run against the in-memory, the SQLite and a real Redis store.

Every test goes through the public StateStore methods only. Expiry tests wait well past a
short ttl and then check that the entry is gone: a lower bound on time, never an upper one.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import pytest

from control_plane.store.base import StateStore
from control_plane.store.errors import StoreConflictError, StoreUnavailableError
from foundation.keys import ALL_KEYS, ApiKeyRecord, KeyLimits
from foundation.records import (
    FirstResponse,
    ModelFailure,
    ModelRecord,
    Placement,
    PlacementEvent,
    PlacementEventKind,
    ResourceSpec,
    ScalingSpec,
    TrafficReport,
    WorkerRecord,
    WorkerState,
)
from tests.control_plane.store.conftest import MakeStore

pytestmark = pytest.mark.anyio

T = TypeVar("T")

WAIT_S = 10.0
"""Generous bound on waiting for one event; a healthy run takes milliseconds."""
SHORT_TTL_S = 0.1
PAST_SHORT_TTL_S = 0.4

RESYNC = PlacementEvent(PlacementEventKind.RESYNC)


async def next_of(events: AsyncIterator[T]) -> T:
    async with asyncio.timeout(WAIT_S):
        return await anext(events)


async def aclose(events: AsyncIterator[Any]) -> None:
    # The StateStore interface promises an AsyncIterator; both stores return async
    # generators, which are closed explicitly so their connections go at once.
    close = getattr(events, "aclose", None)
    if close is not None:
        await close()


@asynccontextmanager
async def placement_events(store: StateStore) -> AsyncIterator[AsyncIterator[PlacementEvent]]:
    """A placement subscription whose opening RESYNC has been read (so it is in place)."""
    events = store.subscribe_placements()
    try:
        assert await next_of(events) == RESYNC
        yield events
    finally:
        await aclose(events)


def model(name: str = "mlp", **changes: Any) -> ModelRecord:
    fields: dict[str, Any] = {
        "name": name,
        "storage_uri": f"s3://models/{name}",
        "backend": "onnxruntime",
        "platform": "onnxruntime_onnx",
        "config": {"max_batch_size": 8, "input": [{"name": "x", "dims": [4]}]},
        "scaling": ScalingSpec(min_replicas=0, max_replicas=3, idle_timeout_s=12.5),
        "resources": ResourceSpec(device="cuda", memory_bytes=1 << 30),
        "generation": 2,
        "created_at": 1_700_000_000.123456,
    }
    fields.update(changes)
    return ModelRecord(**fields)


def worker(worker_id: str = "w1", **changes: Any) -> WorkerRecord:
    fields: dict[str, Any] = {
        "id": worker_id,
        "url": f"http://127.0.0.1:9{len(worker_id)}00",
        "pool": "gpu",
        "device": "cuda",
        "memory_bytes": 80 << 30,
        "state": WorkerState.READY,
        "started_at": 1_700_000_001.5,
    }
    fields.update(changes)
    return WorkerRecord(**fields)


def placement(model_name: str = "mlp", worker_id: str = "w1", **changes: Any) -> Placement:
    fields: dict[str, Any] = {
        "model": model_name,
        "worker_id": worker_id,
        "url": f"http://{worker_id}:8000",
        "generation": 1,
        "since": 1_700_000_002.25,
    }
    fields.update(changes)
    return Placement(**fields)


def added(p: Placement) -> PlacementEvent:
    return PlacementEvent(PlacementEventKind.ADDED, p)


def removed(p: Placement) -> PlacementEvent:
    return PlacementEvent(PlacementEventKind.REMOVED, p)


def report(model_name: str = "mlp", activator_id: str = "a1", **changes: Any) -> TrafficReport:
    fields: dict[str, Any] = {
        "model": model_name,
        "activator_id": activator_id,
        "in_flight": 3,
        "last_request_at": 1_700_000_003.75,
        "reported_at": 1_700_000_004.0,
    }
    fields.update(changes)
    return TrafficReport(**fields)


def first_response(
    model_name: str = "mlp", activator_id: str = "a1", **changes: Any
) -> FirstResponse:
    fields: dict[str, Any] = {
        "model": model_name,
        "activator_id": activator_id,
        "worker_id": "w1",
        "responded_at": 1_700_000_005.125,
        "waited_s": 0.75,
    }
    fields.update(changes)
    return FirstResponse(**fields)


# ---- models ----


async def test_create_then_get_round_trips_every_field(store: StateStore):
    record = model()
    await store.create_model(record)
    assert await store.get_model("mlp") == record


async def test_get_unknown_model_is_none(store: StateStore):
    assert await store.get_model("nope") is None


async def test_create_of_an_existing_name_conflicts_and_keeps_the_first(store: StateStore):
    await store.create_model(model(storage_uri="s3://first"))
    with pytest.raises(StoreConflictError):
        await store.create_model(model(storage_uri="s3://second"))
    stored = await store.get_model("mlp")
    assert stored is not None and stored.storage_uri == "s3://first"


async def test_update_replaces_the_record(store: StateStore):
    await store.create_model(model())
    newer = model(storage_uri="s3://models/mlp-v2", generation=3, config=None)
    await store.update_model(newer)
    assert await store.get_model("mlp") == newer


async def test_a_failure_round_trips_with_the_record(store: StateStore):
    failed = model(failure=ModelFailure(reason="config.pbtxt: bad", failed_at=1_700_000_009.5))
    await store.create_model(failed)
    assert await store.get_model("mlp") == failed
    cleared = dataclasses.replace(failed, failure=None)
    await store.update_model(cleared)
    assert await store.get_model("mlp") == cleared


async def test_update_at_the_expected_generation_replaces_the_record(store: StateStore):
    await store.create_model(model(generation=2))
    failed = model(generation=2, failure=ModelFailure(reason="bad", failed_at=1.5))
    await store.update_model(failed, expected_generation=2)
    assert await store.get_model("mlp") == failed
    # The same write again (a replay after a lost answer) still succeeds.
    await store.update_model(failed, expected_generation=2)
    newer = model(generation=3, storage_uri="s3://models/mlp-v3")
    await store.update_model(newer, expected_generation=2)
    assert await store.get_model("mlp") == newer


async def test_update_at_another_generation_conflicts_and_keeps_the_record(store: StateStore):
    current = model(generation=3, storage_uri="s3://models/mlp-v3")
    await store.create_model(current)
    stale = model(generation=2, failure=ModelFailure(reason="bad", failed_at=1.5))
    with pytest.raises(StoreConflictError):
        await store.update_model(stale, expected_generation=2)
    assert await store.get_model("mlp") == current


async def test_update_of_an_unknown_name_conflicts_and_creates_nothing(store: StateStore):
    with pytest.raises(StoreConflictError):
        await store.update_model(model())
    assert await store.get_model("mlp") is None


async def test_list_models_is_sorted_by_name(store: StateStore):
    for name in ["zeta", "alpha", "mid"]:
        await store.create_model(model(name))
    assert [m.name for m in await store.list_models()] == ["alpha", "mid", "zeta"]


async def test_returned_records_are_copies(store: StateStore):
    await store.create_model(model())
    first = await store.get_model("mlp")
    assert first is not None and first.config is not None
    first.config["max_batch_size"] = 999
    again = await store.get_model("mlp")
    assert again is not None and again.config is not None
    assert again.config["max_batch_size"] == 8


async def test_delete_model_removes_its_placements_traffic_timelines_and_requests(
    store: StateStore,
):
    await store.create_model(model("mlp"))
    await store.create_model(model("other"))
    mine, theirs = placement("mlp", "w1"), placement("other", "w1")
    await store.add_placement(mine)
    await store.add_placement(theirs)
    await store.report_traffic(report("mlp"))
    await store.add_activation("mlp", {"queued": 0.0}, keep=5)

    async with placement_events(store) as events:
        assert await store.delete_model("mlp") is True
        assert await next_of(events) == removed(mine)

    assert await store.get_model("mlp") is None
    assert await store.list_placements() == [theirs]
    assert await store.traffic("mlp") == []
    assert await store.list_activations("mlp") == []
    assert await store.delete_model("mlp") is False
    assert [m.name for m in await store.list_models()] == ["other"]


async def test_delete_model_ends_its_pending_activation_request(store: StateStore):
    await store.create_model(model("mlp"))
    await store.request_activation("mlp")
    await store.delete_model("mlp")
    await store.request_activation("marker")
    requests = store.subscribe_activation_requests()
    try:
        # Only the marker is pending: the deleted model's request went with it.
        assert await next_of(requests) == "marker"
        await store.request_activation("mlp")
        assert await next_of(requests) == "mlp"
    finally:
        await aclose(requests)


# ---- workers ----


async def test_put_worker_inserts_and_replaces(store: StateStore):
    await store.put_worker(worker("w2", state=WorkerState.STARTING))
    await store.put_worker(worker("w1"))
    await store.put_worker(worker("w2", state=WorkerState.DRAINING))
    assert await store.list_workers() == [worker("w1"), worker("w2", state=WorkerState.DRAINING)]


async def test_remove_worker_removes_its_placements_with_events(store: StateStore):
    await store.put_worker(worker("w1"))
    await store.put_worker(worker("w2"))
    gone_a, gone_b, kept = placement("a", "w1"), placement("b", "w1"), placement("a", "w2")
    for p in (gone_a, gone_b, kept):
        await store.add_placement(p)

    async with placement_events(store) as events:
        await store.remove_worker("w1")
        got = {await next_of(events), await next_of(events)}
        assert got == {removed(gone_a), removed(gone_b)}
        await store.remove_worker("never-registered")
        marker = placement("marker", "w9")
        await store.add_placement(marker)
        assert await next_of(events) == added(marker)

    assert await store.list_workers() == [worker("w2")]
    assert await store.list_placements() == [kept, marker]


# ---- sleeping replicas ----


async def test_sleeping_replicas_are_kept_apart_from_placements(store: StateStore):
    asleep = placement("llm", "w1")
    async with placement_events(store) as events:
        await store.put_sleeping(asleep)
        await store.put_sleeping(placement("llm", "w2"))
        await store.put_sleeping(placement("other", "w1"))
        marker = placement("marker", "w9")
        await store.add_placement(marker)
        # Activators never hear of sleeping replicas: the next event is the marker's.
        assert await next_of(events) == added(marker)
    assert await store.list_placements() == [marker]
    assert [(p.model, p.worker_id) for p in await store.list_sleeping()] == [
        ("llm", "w1"),
        ("llm", "w2"),
        ("other", "w1"),
    ]
    assert await store.list_sleeping("llm") == [asleep, placement("llm", "w2")]


async def test_only_one_caller_removes_a_sleeping_replica(store: StateStore):
    await store.put_sleeping(placement("llm", "w1"))
    results = await asyncio.gather(*(store.remove_sleeping("llm", "w1") for _ in range(5)))
    assert sorted(results) == [False, False, False, False, True]
    assert await store.list_sleeping() == []


async def test_deleting_a_model_or_a_worker_forgets_its_sleeping_replicas(store: StateStore):
    await store.create_model(model("llm"))
    for pair in (("llm", "w1"), ("llm", "w2"), ("other", "w1"), ("other", "w2")):
        await store.put_sleeping(placement(*pair))
    await store.delete_model("llm")
    await store.remove_worker("w1")
    assert await store.list_sleeping() == [placement("other", "w2")]


# ---- placements ----


async def test_placement_events_follow_the_changes_in_order(store: StateStore):
    p1, p2 = placement("mlp", "w1"), placement("mlp", "w2")
    async with placement_events(store) as events:
        await store.add_placement(p1)
        await store.add_placement(p2)
        await store.remove_placement("mlp", "w1")
        assert await next_of(events) == added(p1)
        assert await next_of(events) == added(p2)
        assert await next_of(events) == removed(p1)


async def test_removing_an_absent_placement_publishes_nothing(store: StateStore):
    async with placement_events(store) as events:
        await store.remove_placement("mlp", "nowhere")
        marker = placement("marker", "w1")
        await store.add_placement(marker)
        assert await next_of(events) == added(marker)


async def test_list_placements_all_and_by_model(store: StateStore):
    b, a2, a1 = placement("b", "w1"), placement("a", "w2"), placement("a", "w1")
    for p in (b, a2, a1):
        await store.add_placement(p)
    assert await store.list_placements() == [a1, a2, b]
    assert await store.list_placements("a") == [a1, a2]
    assert await store.list_placements("none") == []


async def test_adding_a_placement_again_replaces_it_and_publishes(store: StateStore):
    old = placement("mlp", "w1", generation=1)
    new = placement("mlp", "w1", generation=2, url="http://w1:9000")
    await store.add_placement(old)
    async with placement_events(store) as events:
        await store.add_placement(new)
        assert await next_of(events) == added(new)
    assert await store.list_placements() == [new]


async def test_names_that_look_like_separators_stay_apart(store: StateStore):
    # Redis keys and fields are built from names; no pair of names may collide.
    tricky = [
        placement("a:b", "c"),
        placement("a", "b:c"),
        placement('a"', "b"),
        placement("é", "/"),
    ]
    for p in tricky:
        await store.add_placement(p)
    assert sorted(await store.list_placements(), key=repr) == sorted(tricky, key=repr)
    await store.add_activation("x", {"n": 1}, keep=3)
    await store.add_activation("x:y", {"n": 2}, keep=3)
    assert await store.list_activations("x") == [{"n": 1}]
    await store.report_traffic(report("pending"))
    await store.request_activation("pending")
    assert await store.traffic("pending") == [report("pending")]


async def test_every_subscriber_gets_every_event(store: StateStore):
    p = placement()
    async with placement_events(store) as first, placement_events(store) as second:
        await store.add_placement(p)
        assert await next_of(first) == added(p)
        assert await next_of(second) == added(p)


# ---- activation requests ----


async def test_activation_request_pending_before_subscribing_is_delivered(store: StateStore):
    await store.request_activation("mlp")
    requests = store.subscribe_activation_requests()
    try:
        assert await next_of(requests) == "mlp"
    finally:
        await aclose(requests)


async def test_repeated_request_while_pending_is_not_published_again(store: StateStore):
    await store.request_activation("mlp")
    requests = store.subscribe_activation_requests()
    try:
        assert await next_of(requests) == "mlp"  # the subscription is in place now
        await store.request_activation("mlp")
        await store.request_activation("other")
        assert await next_of(requests) == "other"
    finally:
        await aclose(requests)


async def test_a_placement_ends_the_pending_request(store: StateStore):
    await store.request_activation("mlp")
    requests = store.subscribe_activation_requests()
    try:
        assert await next_of(requests) == "mlp"
        await store.add_placement(placement("mlp", "w1"))
        await store.request_activation("mlp")
        assert await next_of(requests) == "mlp"
    finally:
        await aclose(requests)


async def test_a_pending_request_lapses_after_its_ttl(make_store: MakeStore):
    store = make_store(activation_pending_ttl_s=SHORT_TTL_S)
    await store.request_activation("mlp")
    requests = store.subscribe_activation_requests()
    try:
        assert await next_of(requests) == "mlp"
        await asyncio.sleep(PAST_SHORT_TTL_S)
        await store.request_activation("mlp")
        assert await next_of(requests) == "mlp"
    finally:
        await aclose(requests)


# ---- first responses ----


async def test_first_responses_kept_before_subscribing_come_first_then_new_ones(store: StateStore):
    early, later = first_response("mlp", "a1"), first_response("mlp", "a2", waited_s=1.5)
    await store.report_first_response(early)
    reports = store.subscribe_first_responses()
    try:
        assert await next_of(reports) == early  # the subscription is in place now
        newest = first_response("other", "a1", worker_id="w9")
        await store.report_first_response(later)
        await store.report_first_response(newest)
        assert await next_of(reports) == later
        assert await next_of(reports) == newest
    finally:
        await aclose(reports)


async def test_a_new_subscription_replays_every_kept_first_response(store: StateStore):
    kept = [first_response("mlp", "a1"), first_response("mlp", "a2")]
    for report in kept:
        await store.report_first_response(report)
    for _ in range(2):  # a control plane that takes over after another one read them
        reports = store.subscribe_first_responses()
        try:
            assert [await next_of(reports), await next_of(reports)] == kept
        finally:
            await aclose(reports)


async def test_first_responses_lapse_after_their_ttl(make_store: MakeStore):
    store = make_store(activation_pending_ttl_s=SHORT_TTL_S)
    await store.report_first_response(first_response("mlp", "old"))
    await asyncio.sleep(PAST_SHORT_TTL_S)
    marker = first_response("marker")
    await store.report_first_response(marker)
    reports = store.subscribe_first_responses()
    try:
        assert await next_of(reports) == marker
    finally:
        await aclose(reports)


# ---- traffic ----


async def test_traffic_keeps_the_latest_report_of_each_activator(store: StateStore):
    await store.report_traffic(report("mlp", "a2", in_flight=1))
    await store.report_traffic(report("mlp", "a1", in_flight=5))
    await store.report_traffic(report("mlp", "a2", in_flight=7, reported_at=1_700_000_009.5))
    await store.report_traffic(report("other", "a1", in_flight=2))
    assert await store.traffic("mlp") == [
        report("mlp", "a1", in_flight=5),
        report("mlp", "a2", in_flight=7, reported_at=1_700_000_009.5),
    ]
    assert await store.traffic("unknown") == []


async def test_traffic_reports_expire(make_store: MakeStore):
    store = make_store(traffic_ttl_s=SHORT_TTL_S)
    await store.report_traffic(report("mlp", "a1"))
    await asyncio.sleep(PAST_SHORT_TTL_S)
    assert await store.traffic("mlp") == []
    await store.report_traffic(report("mlp", "a2"))
    assert await store.traffic("mlp") == [report("mlp", "a2")]


# ---- activation timelines ----


async def test_activations_are_newest_first_and_capped(store: StateStore):
    for n in range(5):
        await store.add_activation("mlp", {"n": n, "steps": {"queued": 0.5, "ready": 1.25}}, keep=3)
    got = await store.list_activations("mlp")
    assert [t["n"] for t in got] == [4, 3, 2]
    assert got[0]["steps"] == {"queued": 0.5, "ready": 1.25}
    assert await store.list_activations("other") == []


async def test_update_activation_replaces_the_timeline_with_that_id_in_place(store: StateStore):
    for n in range(3):
        await store.add_activation("mlp", {"id": f"t{n}", "phases": ["queued"]}, keep=3)
    updated = {"id": "t1", "phases": ["queued", "ready", "first_response"], "at_s": 0.25}
    assert await store.update_activation("mlp", updated) is True
    assert await store.list_activations("mlp") == [
        {"id": "t2", "phases": ["queued"]},
        updated,
        {"id": "t0", "phases": ["queued"]},
    ]


async def test_update_activation_of_a_timeline_no_longer_kept_changes_nothing(store: StateStore):
    await store.add_activation("mlp", {"id": "old"}, keep=1)
    await store.add_activation("mlp", {"id": "new"}, keep=1)
    assert await store.update_activation("mlp", {"id": "old", "x": 1}) is False
    assert await store.update_activation("other", {"id": "new", "x": 1}) is False
    assert await store.list_activations("mlp") == [{"id": "new"}]
    assert await store.list_activations("other") == []


async def test_update_activation_needs_a_str_id(store: StateStore):
    with pytest.raises(ValueError, match="id"):
        await store.update_activation("mlp", {"n": 1})


async def test_activations_need_keep_of_at_least_one(store: StateStore):
    with pytest.raises(ValueError, match="keep"):
        await store.add_activation("mlp", {}, keep=0)


# ---- per-model control state ----


async def test_model_state_is_kept_per_model_and_key_and_replaced(store: StateStore):
    assert await store.get_model_state("mlp", "keepalive") is None
    doc = {"counts": [0.5, 1.25], "updated_at": None, "nested": {"x": [1, 2]}}
    await store.put_model_state("mlp", "keepalive", doc)
    await store.put_model_state("mlp", "other", {"n": 1})
    await store.put_model_state("resnet", "keepalive", {"n": 2})
    assert await store.get_model_state("mlp", "keepalive") == doc
    await store.put_model_state("mlp", "keepalive", {"n": 3})
    assert await store.get_model_state("mlp", "keepalive") == {"n": 3}
    assert await store.get_model_state("mlp", "other") == {"n": 1}
    assert await store.get_model_state("resnet", "keepalive") == {"n": 2}


async def test_delete_model_forgets_its_state(store: StateStore):
    await store.create_model(model("mlp"))
    await store.put_model_state("mlp", "keepalive", {"n": 1})
    await store.put_model_state("resnet", "keepalive", {"n": 2})
    assert await store.delete_model("mlp") is True
    assert await store.get_model_state("mlp", "keepalive") is None
    assert await store.get_model_state("resnet", "keepalive") == {"n": 2}


# ---- lease ----


async def test_lease_is_held_by_one_holder_until_released(store: StateStore):
    assert await store.try_acquire_lease("cp-1", ttl_s=60)
    assert not await store.try_acquire_lease("cp-2", ttl_s=60)
    assert await store.try_acquire_lease("cp-1", ttl_s=60)  # renew
    await store.release_lease("cp-2")  # not the holder: no effect
    assert not await store.try_acquire_lease("cp-2", ttl_s=60)
    await store.release_lease("cp-1")
    assert await store.try_acquire_lease("cp-2", ttl_s=60)
    assert not await store.try_acquire_lease("cp-1", ttl_s=60)


async def test_lease_lapses_after_its_ttl(store: StateStore):
    assert await store.try_acquire_lease("cp-1", ttl_s=SHORT_TTL_S)
    await asyncio.sleep(PAST_SHORT_TTL_S)
    assert await store.try_acquire_lease("cp-2", ttl_s=60)
    assert not await store.try_acquire_lease("cp-1", ttl_s=60)


async def test_lease_ttl_must_be_positive(store: StateStore):
    with pytest.raises(ValueError, match="ttl_s"):
        await store.try_acquire_lease("cp-1", ttl_s=0)


# ---- API keys ----


def api_key(key_id: str = "0123456789ab", **changes: Any) -> ApiKeyRecord:
    fields: dict[str, Any] = {
        "id": key_id,
        "name": f"team-{key_id}",
        "secret_sha256": "ab" * 32,
        "models": ("mlp", "resnet-*"),
        "limits": KeyLimits(requests_per_s=2.5, burst=5, max_in_flight=3, activations_per_hour=4),
        "created_at": 1_700_000_000.25,
        "expires_at": 1_800_000_000.5,
    }
    fields.update(changes)
    return ApiKeyRecord(**fields)


async def test_a_key_round_trips_and_its_id_is_unique(store: StateStore):
    record = api_key()
    await store.create_key(record)
    assert await store.get_key(record.id) == record
    assert await store.get_key("ffffffffffff") is None
    with pytest.raises(StoreConflictError):
        await store.create_key(api_key(name="another"))
    unlimited = api_key("a0a0a0a0a0a0", models=("*",), limits=KeyLimits(), expires_at=None)
    await store.create_key(unlimited)
    assert await store.list_keys() == [record, unlimited]


async def test_revoking_keeps_the_record_marked_and_its_first_time(store: StateStore):
    await store.create_key(api_key())
    revoked = await store.revoke_key(api_key().id, revoked_at=1_750_000_000.0)
    assert revoked == api_key(revoked_at=1_750_000_000.0)
    assert await store.get_key(api_key().id) == revoked
    again = await store.revoke_key(api_key().id, revoked_at=1_760_000_000.0)
    assert again is not None and again.revoked_at == 1_750_000_000.0
    assert await store.revoke_key("ffffffffffff", revoked_at=1.0) is None
    assert await store.list_keys() == [revoked]


async def test_revocations_reach_every_subscriber_after_all_keys(store: StateStore):
    first = store.subscribe_key_revocations()
    second = store.subscribe_key_revocations()
    try:
        assert await next_of(first) == ALL_KEYS
        assert await next_of(second) == ALL_KEYS
        await store.create_key(api_key())
        await store.create_key(api_key("bbbbbbbbbbbb"))
        await store.revoke_key("bbbbbbbbbbbb", revoked_at=5.0)
        await store.revoke_key(api_key().id, revoked_at=6.0)
        # A revocation of an unknown id publishes nothing.
        await store.revoke_key("cccccccccccc", revoked_at=7.0)
        for events in (first, second):
            assert await next_of(events) == "bbbbbbbbbbbb"
            assert await next_of(events) == api_key().id
    finally:
        await aclose(first)
        await aclose(second)


# ---- close ----


async def test_calls_after_close_raise_store_unavailable(store: StateStore):
    await store.close()
    with pytest.raises(StoreUnavailableError, match="closed"):
        await store.list_models()
    with pytest.raises(StoreUnavailableError):
        await store.add_placement(placement())
    await store.close()  # idempotent


async def test_close_ends_open_and_new_subscriptions(store: StateStore):
    placements = store.subscribe_placements()
    requests = store.subscribe_activation_requests()
    reports = store.subscribe_first_responses()
    revocations = store.subscribe_key_revocations()
    try:
        assert await next_of(placements) == RESYNC
        assert await next_of(revocations) == ALL_KEYS
        await store.request_activation("mlp")
        assert await next_of(requests) == "mlp"
        await store.report_first_response(first_response())
        assert await next_of(reports) == first_response()

        async def wait_for_next() -> PlacementEvent:
            return await anext(placements)

        waiting = asyncio.create_task(wait_for_next())
        await asyncio.sleep(0)  # let it start waiting
        await store.close()
        with pytest.raises(StopAsyncIteration):
            async with asyncio.timeout(WAIT_S):
                await waiting
        with pytest.raises(StopAsyncIteration):
            await next_of(requests)
        with pytest.raises(StopAsyncIteration):
            await next_of(reports)
        with pytest.raises(StopAsyncIteration):
            await next_of(store.subscribe_placements())
        with pytest.raises(StopAsyncIteration):
            await next_of(store.subscribe_first_responses())
        with pytest.raises(StopAsyncIteration):
            await next_of(revocations)
        with pytest.raises(StopAsyncIteration):
            await next_of(store.subscribe_key_revocations())
        with pytest.raises(StoreUnavailableError):
            await store.get_key(api_key().id)
    finally:
        await aclose(revocations)
        await aclose(placements)
        await aclose(requests)
        await aclose(reports)
