"""Where a new replica goes: ``choose`` over tables of pool snapshots, no store or clock."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from control_plane.backends.base import PoolSpec
from control_plane.placement import (
    Decision,
    Evict,
    NoCapacity,
    Place,
    PoolView,
    StartWorker,
    Traffic,
    WaitForStarts,
    choose,
    traffic_needed,
)
from foundation.records import (
    ModelRecord,
    Placement,
    ResourceSpec,
    ScalingSpec,
    WorkerRecord,
    WorkerState,
)

IDLE = Traffic(in_flight=0, last_request_at=0.0)


def _worker(
    worker_id: str,
    *,
    memory_bytes: int = 0,
    device: str = "cpu",
    state: WorkerState = WorkerState.READY,
    started_at: float = 0.0,
) -> WorkerRecord:
    return WorkerRecord(
        id=worker_id,
        url=f"http://{worker_id}",
        device=device,
        memory_bytes=memory_bytes,
        state=state,
        started_at=started_at,
    )


def _model(
    name: str, *, memory_bytes: int = 0, device: str = "cpu", min_replicas: int = 0
) -> ModelRecord:
    return ModelRecord(
        name=name,
        storage_uri=f"/models/{name}",
        scaling=ScalingSpec(min_replicas=min_replicas, max_replicas=4),
        resources=ResourceSpec(device=device, memory_bytes=memory_bytes),
    )


def _at(model: str, worker_id: str, *, since: float = 0.0) -> Placement:
    return Placement(model=model, worker_id=worker_id, url=f"http://{worker_id}", since=since)


W1 = _worker("w1", started_at=1.0)
W2 = _worker("w2", started_at=2.0)
M = _model("m")
A, B = _model("a"), _model("b")
BIG = _model("big", memory_bytes=60)


def _view(
    *workers: WorkerRecord,
    max_workers: int = 2,
    device: str = "cpu",
    memory_bytes: int = 0,
    models: tuple[ModelRecord, ...] = (A, B),
    **fields: Any,
) -> PoolView:
    return PoolView(
        pool=PoolSpec(
            name="default", device=device, memory_bytes=memory_bytes, max_workers=max_workers
        ),
        workers=workers,
        models={m.name: m for m in models},
        **fields,
    )


CASES = [
    # ---- refusals ----
    pytest.param(
        _view(),
        _model("gpu", device="cuda"),
        NoCapacity(reason="pool 'default' has no cuda workers"),
        id="cuda-model-on-a-cpu-pool",
    ),
    pytest.param(
        _view(memory_bytes=100),
        _model("huge", memory_bytes=101),
        NoCapacity(reason="it needs 101 bytes and a worker has 100"),
        id="larger-than-a-worker",
    ),
    # ---- a worker with room ----
    pytest.param(_view(), M, StartWorker(), id="empty-pool-starts-a-worker"),
    pytest.param(
        _view(W1, W2, placements=(_at("a", "w2"),)),
        M,
        Place(W2),
        id="packs-onto-the-fullest",
    ),
    pytest.param(
        _view(W1, W2, placements=(_at("a", "w2"),), warm={"w1": frozenset({"m"})}),
        M,
        Place(W1),
        id="a-warm-cache-beats-packing",
    ),
    pytest.param(
        _view(W1, W2, reserved={"w2": {"a": 0}}),
        M,
        Place(W2),
        id="loads-under-way-count-as-fullness",
    ),
    pytest.param(
        _view(W1, W2, sleeping=(_at("a", "w2"),)),
        M,
        Place(W2),
        id="sleepers-count-as-fullness",
    ),
    pytest.param(
        _view(_worker("w2", started_at=2.0), _worker("w1", started_at=1.0)),
        M,
        Place(_worker("w1", started_at=1.0)),
        id="the-oldest-breaks-a-tie",
    ),
    pytest.param(
        _view(_worker("w1", device="cuda"), device="cuda"),
        M,
        Place(_worker("w1", device="cuda")),
        id="a-cpu-model-may-use-a-cuda-worker",
    ),
    pytest.param(
        _view(_worker("w1", device="cuda"), device="cuda"),
        _model("gpu", device="cuda"),
        Place(_worker("w1", device="cuda")),
        id="a-cuda-model-on-a-cuda-worker",
    ),
    # ---- workers that do not count ----
    pytest.param(
        _view(W1, placements=(_at("m", "w1"),)),
        M,
        StartWorker(),
        id="not-beside-its-own-replica",
    ),
    pytest.param(
        _view(W1, reserved={"w1": {"m": 0}}),
        M,
        StartWorker(),
        id="not-beside-its-own-load",
    ),
    pytest.param(
        _view(W1, retiring=frozenset({("m", "w1")})),
        M,
        StartWorker(),
        id="not-beside-its-own-retiring-replica",
    ),
    pytest.param(
        _view(_worker("w1", state=WorkerState.STARTING)),
        M,
        StartWorker(),
        id="not-on-a-worker-still-starting",
    ),
    pytest.param(
        _view(W1, stopping=frozenset({"w1"})),
        M,
        StartWorker(),
        id="not-on-a-worker-being-stopped",
    ),
    # ---- room: model count and memory ----
    pytest.param(
        _view(W1, placements=(_at("a", "w1"),), max_models_per_worker=1),
        M,
        StartWorker(),
        id="models-per-worker-bound",
    ),
    pytest.param(
        _view(W1, reserved={"w1": {"a": 0}}, max_models_per_worker=1),
        M,
        StartWorker(),
        id="a-load-under-way-takes-a-slot",
    ),
    pytest.param(
        _view(W1, retiring=frozenset({("a", "w1")}), max_models_per_worker=1),
        M,
        Place(W1),
        id="a-retiring-replica-takes-no-slot",
    ),
    pytest.param(
        _view(
            _worker("w1", memory_bytes=100),
            placements=(_at("big", "w1"),),
            models=(BIG,),
            memory_bytes=100,
        ),
        _model("m", memory_bytes=50),
        StartWorker(),
        id="memory-budget-full",
    ),
    pytest.param(
        _view(
            _worker("w1", memory_bytes=100),
            placements=(_at("big", "w1"),),
            models=(BIG,),
            memory_bytes=100,
        ),
        _model("m", memory_bytes=40),
        Place(_worker("w1", memory_bytes=100)),
        id="memory-budget-fits-exactly",
    ),
    pytest.param(
        _view(_worker("w1", memory_bytes=100), reserved={"w1": {"a": 60}}, memory_bytes=100),
        _model("m", memory_bytes=50),
        StartWorker(),
        id="reserved-bytes-count",
    ),
    pytest.param(
        _view(
            _worker("w1", memory_bytes=100),
            sleeping=(_at("big", "w1"),),
            models=(BIG,),
            memory_bytes=100,
        ),
        _model("m", memory_bytes=50),
        StartWorker(),
        id="a-sleeper-holds-its-memory",
    ),
    pytest.param(
        _view(
            _worker("w1", memory_bytes=100),
            placements=(_at("unknown", "w1"),),
            models=(),
            memory_bytes=100,
        ),
        _model("m", memory_bytes=100),
        Place(_worker("w1", memory_bytes=100)),
        id="an-unregistered-model-takes-no-memory",
    ),
    pytest.param(
        _view(
            _worker("w1", memory_bytes=100),
            sleeping=(_at("m", "w1"),),
            models=(_model("m", memory_bytes=10),),
            memory_bytes=100,
        ),
        _model("m", memory_bytes=60),
        StartWorker(),
        id="the-model-as-given-overrides-its-stored-record",
    ),
    # ---- a full pool: evictions ----
    pytest.param(
        _view(
            W1,
            max_workers=1,
            max_models_per_worker=2,
            placements=(_at("a", "w1", since=10.0),),
            sleeping=(_at("b", "w1", since=20.0),),
            traffic={"a": IDLE},
        ),
        M,
        Evict(W1, _at("b", "w1", since=20.0), is_sleeping=True),
        id="a-sleeper-goes-before-an-idle-replica",
    ),
    pytest.param(
        _view(
            W1,
            W2,
            max_workers=2,
            max_models_per_worker=1,
            sleeping=(_at("a", "w1", since=20.0), _at("b", "w2", since=10.0)),
        ),
        M,
        Evict(W2, _at("b", "w2", since=10.0), is_sleeping=True),
        id="the-longest-asleep-goes-first",
    ),
    pytest.param(
        _view(
            W1,
            max_workers=1,
            max_models_per_worker=1,
            sleeping=(_at("a", "w1"),),
            unloading=frozenset({("a", "w1")}),
        ),
        M,
        NoCapacity(
            reason="all 1 cpu workers are full, the pool is at max_workers=1 "
            "and no idle replica can be evicted"
        ),
        id="not-a-sleeper-already-unloading",
    ),
    pytest.param(
        _view(
            W1,
            max_workers=1,
            max_models_per_worker=2,
            placements=(_at("a", "w1"), _at("b", "w1")),
            traffic={
                "a": Traffic(in_flight=0, last_request_at=100.0),
                "b": Traffic(in_flight=0, last_request_at=50.0),
            },
        ),
        M,
        Evict(W1, _at("b", "w1"), is_sleeping=False),
        id="the-least-recently-used-idle-replica",
    ),
    pytest.param(
        _view(
            W1,
            max_workers=1,
            max_models_per_worker=2,
            placements=(_at("a", "w1", since=70.0), _at("b", "w1", since=10.0)),
            traffic={
                "a": Traffic(in_flight=0, last_request_at=30.0),
                "b": Traffic(in_flight=0, last_request_at=60.0),
            },
        ),
        M,
        Evict(W1, _at("b", "w1", since=10.0), is_sleeping=False),
        id="last-use-is-the-later-of-request-and-placement",
    ),
    pytest.param(
        _view(
            W1,
            max_workers=1,
            max_models_per_worker=2,
            placements=(_at("a", "w1"), _at("b", "w1")),
            traffic={"a": Traffic(in_flight=3), "b": IDLE},
        ),
        M,
        Evict(W1, _at("b", "w1"), is_sleeping=False),
        id="not-a-busy-replica",
    ),
    pytest.param(
        _view(
            W1,
            max_workers=1,
            max_models_per_worker=2,
            models=(_model("a", min_replicas=1), B),
            placements=(_at("a", "w1"), _at("b", "w1", since=50.0)),
            traffic={"a": IDLE, "b": IDLE},
        ),
        M,
        Evict(W1, _at("b", "w1", since=50.0), is_sleeping=False),
        id="not-a-models-last-min-replicas",
    ),
    pytest.param(
        _view(
            W1,
            W2,
            max_workers=2,
            max_models_per_worker=1,
            models=(_model("a", min_replicas=1), B),
            placements=(_at("a", "w1"), _at("a", "w2")),
            traffic={"a": IDLE},
        ),
        M,
        Evict(W1, _at("a", "w1"), is_sleeping=False),
        id="a-replica-above-min-replicas-may-go",
    ),
    pytest.param(
        _view(
            W1,
            max_workers=1,
            max_models_per_worker=2,
            placements=(_at("a", "w1"), _at("b", "w1", since=50.0)),
            retiring=frozenset({("a", "w1")}),
            traffic={"a": IDLE, "b": IDLE},
        ),
        M,
        Evict(W1, _at("b", "w1", since=50.0), is_sleeping=False),
        id="not-a-replica-already-retiring",
    ),
    pytest.param(
        _view(
            W1,
            max_workers=1,
            max_models_per_worker=2,
            placements=(_at("a", "w1"), _at("b", "w1", since=50.0)),
            traffic={"b": IDLE},
        ),
        M,
        Evict(W1, _at("b", "w1", since=50.0), is_sleeping=False),
        id="not-a-replica-whose-traffic-was-not-read",
    ),
    pytest.param(
        _view(
            W1,
            max_workers=1,
            max_models_per_worker=1,
            models=(),
            placements=(_at("ghost", "w1"),),
            traffic={"ghost": IDLE},
        ),
        M,
        NoCapacity(
            reason="all 1 cpu workers are full, the pool is at max_workers=1 "
            "and no idle replica can be evicted"
        ),
        id="not-a-replica-of-an-unregistered-model",
    ),
    pytest.param(
        _view(
            _worker("w1", memory_bytes=100),
            max_workers=1,
            memory_bytes=100,
            models=(_model("a", memory_bytes=30), _model("b", memory_bytes=60)),
            placements=(_at("a", "w1"), _at("b", "w1", since=50.0)),
            traffic={"a": IDLE, "b": IDLE},
        ),
        _model("m", memory_bytes=50),
        Evict(_worker("w1", memory_bytes=100), _at("b", "w1", since=50.0), is_sleeping=False),
        id="only-an-eviction-that-makes-room",
    ),
    pytest.param(
        _view(
            W1,
            max_workers=1,
            max_models_per_worker=1,
            placements=(_at("a", "w1"),),
            traffic={"a": Traffic(in_flight=1)},
            starting=0,
        ),
        M,
        NoCapacity(
            reason="all 1 cpu workers are full, the pool is at max_workers=1 "
            "and no idle replica can be evicted"
        ),
        id="nothing-to-evict",
    ),
    pytest.param(
        _view(W1, max_workers=2, max_models_per_worker=1, placements=(_at("a", "w1"),), starting=1),
        M,
        WaitForStarts(),
        id="wait-for-workers-starting",
    ),
    pytest.param(
        _view(
            W1,
            max_workers=2,
            max_models_per_worker=1,
            placements=(_at("a", "w1"),),
            traffic={"a": IDLE},
            starting=1,
        ),
        M,
        Evict(W1, _at("a", "w1"), is_sleeping=False),
        id="an-eviction-goes-before-waiting-for-starts",
    ),
]


@pytest.mark.parametrize(("view", "model", "expected"), CASES)
def test_choose(view: PoolView, model: ModelRecord, expected: Decision):
    assert choose(view, model) == expected


@pytest.mark.parametrize(("view", "model", "expected"), CASES)
def test_the_traffic_needed_is_all_the_traffic_choose_reads(
    view: PoolView, model: ModelRecord, expected: Decision
):
    """With the traffic of only the models ``traffic_needed`` names, the decision is the same
    as with every model's (the placer reads only those)."""
    everyone = {p.model: view.traffic.get(p.model, IDLE) for p in view.placements}
    full = replace(view, traffic=everyone)
    needed = traffic_needed(full, model)
    trimmed = replace(full, traffic={name: everyone[name] for name in needed})
    assert choose(trimmed, model) == choose(full, model)


@pytest.mark.parametrize(
    ("view", "model", "expected"),
    [
        pytest.param(_view(W1), M, frozenset(), id="a-worker-has-room"),
        pytest.param(
            _view(W1, max_models_per_worker=1, placements=(_at("a", "w1"),)),
            M,
            frozenset(),
            id="the-pool-may-grow",
        ),
        pytest.param(
            _view(W1, max_workers=1, max_models_per_worker=1, sleeping=(_at("b", "w1"),)),
            M,
            frozenset(),
            id="a-sleeper-can-go",
        ),
        pytest.param(_view(), _model("gpu", device="cuda"), frozenset(), id="refused"),
        pytest.param(
            _view(
                W1,
                W2,
                max_workers=2,
                max_models_per_worker=2,
                models=(_model("a"), _model("b"), _model("c", min_replicas=1), M),
                placements=(
                    _at("a", "w1"),
                    _at("b", "w1"),
                    _at("c", "w2"),
                    _at("m", "w2"),
                ),
                retiring=frozenset({("b", "w1")}),
            ),
            M,
            frozenset({"a"}),
            id="the-evictable-replicas-models",
        ),
    ],
)
def test_traffic_needed(view: PoolView, model: ModelRecord, expected: frozenset[str]):
    assert traffic_needed(view, model) == expected
