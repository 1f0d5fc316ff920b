"""The trace manager without a transport: setting semantics (server, per-model overrides,
clearing, validity), sampling by rate and count, and what lands in the trace files when, as
real Triton 2.51 does it (observed: numbered files per log frequency and when the count runs
out, the trace file itself when a setting retires)."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from data_plane.batcher import BatchedResult
from data_plane.errors import InvalidArgumentError
from data_plane.trace import TraceConfig, TraceLevel, TraceManager, TraceUpdate, TraceValues
from data_plane.trace.writer import TraceWriter

pytestmark = pytest.mark.anyio

ON = TraceLevel.TIMESTAMPS
TIMESTAMP_NAMES = [
    "REQUEST_START",
    "QUEUE_START",
    "COMPUTE_START",
    "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START",
    "COMPUTE_END",
    "REQUEST_END",
]


@dataclass(frozen=True)
class Spec:
    datatype: str


@dataclass(frozen=True)
class Model:
    name: str
    version: int = 1
    inputs: dict[str, Spec] = field(default_factory=lambda: {"INPUT0": Spec("FP32")})
    outputs: dict[str, Spec] = field(default_factory=lambda: {"OUTPUT0": Spec("FP32")})


def result(start_ns: int) -> BatchedResult:
    return BatchedResult(
        outputs={"OUTPUT0": np.array([[2.0, 3.5]], dtype=np.float32)},
        queue_ns=20,
        compute_ns=50,
        batch_size=1,
        compute_start_ns=start_ns + 40,
        exec_start_ns=start_ns + 30,
        exec_end_ns=start_ns + 100,
    )


def serve(manager: TraceManager, model: Model, count: int = 1, *, request_id: str = "") -> int:
    """Run ``count`` requests for ``model`` through sampling; return how many were traced."""
    traced = 0
    for _ in range(count):
        trace = manager.sample(model.name)
        if trace is None:
            continue
        traced += 1
        trace.finish(
            model,
            request_id or None,
            request_start_ns=1000,
            request_end_ns=1200,
            result=result(1000),
            inputs={"INPUT0": np.array([[1.0, 2.0]], dtype=np.float32)},
        )
    return traced


def read(path: Path) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = json.loads(path.read_text())
    return entries


def written(path: Path) -> str:
    """What is in ``path`` so far ("" before it exists)."""
    return path.read_text() if path.exists() else ""


def trace_ids(path: Path) -> list[int]:
    return sorted({entry["id"] for entry in read(path)})


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    return tmp_path / "trace.json"


@pytest.fixture
def manager(trace_file: Path) -> TraceManager:
    return TraceManager(TraceConfig(trace_file=str(trace_file)))


async def test_defaults_are_tritons_and_trace_nothing(manager: TraceManager, trace_file: Path):
    assert manager.settings() == TraceValues(
        level=TraceLevel.OFF, rate=1000, count=-1, log_frequency=0, file=str(trace_file)
    )
    assert manager.settings("any") == manager.settings()
    assert not manager.is_active
    assert manager.sample("m") is None


async def test_turning_on_without_a_trace_file_is_refused():
    manager = TraceManager(TraceConfig())
    with pytest.raises(InvalidArgumentError) as caught:
        manager.update(None, TraceUpdate(level=ON))
    assert caught.value.message == (
        "Attempting to set invalid trace setting :trace file name is not given"
    )
    assert manager.settings().level == TraceLevel.OFF
    # Turning it off, or changing a value while off, is fine without a file.
    manager.update(None, TraceUpdate(rate=0, count=3))
    assert manager.settings().rate == 0


async def test_invalid_combinations_get_tritons_texts(manager: TraceManager):
    with pytest.raises(InvalidArgumentError) as caught:
        manager.update(None, TraceUpdate(level=ON, rate=0))
    assert caught.value.message == (
        "Attempting to set invalid trace setting :sample rate must be non-zero"
    )
    with pytest.raises(InvalidArgumentError) as caught:
        manager.update(None, TraceUpdate(level=ON, count=0))
    assert caught.value.message == "Attempting to set invalid trace setting :"
    assert manager.settings().level == TraceLevel.OFF


async def test_count_counts_down_and_an_exhausted_setting_refuses_changes(manager: TraceManager):
    manager.update(None, TraceUpdate(level=ON, rate=1, count=3))
    assert serve(manager, Model("m"), 2) == 2
    assert manager.settings().count == 1
    assert serve(manager, Model("m"), 5) == 1
    assert manager.settings().count == 0
    with pytest.raises(InvalidArgumentError) as caught:
        manager.update(None, TraceUpdate(rate=5))
    assert caught.value.message == "Attempting to set invalid trace setting :"
    manager.update(None, TraceUpdate(count=-1))
    assert manager.settings().count == -1
    await manager.close(timeout_s=10)


async def test_rate_takes_every_nth_request_and_ids_run_on(manager: TraceManager):
    manager.update(None, TraceUpdate(level=ON, rate=3))
    sampled = [manager.sample("m") for _ in range(7)]
    assert [t is not None for t in sampled] == [False, False, True, False, False, True, False]
    assert [t.id for t in sampled if t is not None] == [1, 2]
    # A new setting starts counting again.
    manager.update(None, TraceUpdate(rate=2))
    assert [manager.sample("m") is not None for _ in range(2)] == [False, True]


async def test_a_model_setting_overrides_field_by_field(manager: TraceManager):
    manager.update("a", TraceUpdate(rate=7))
    manager.update(None, TraceUpdate(rate=3, count=10))
    assert manager.settings("a") == TraceValues(
        level=TraceLevel.OFF, rate=7, count=10, log_frequency=0, file=manager.settings().file
    )
    assert manager.settings().rate == 3
    assert manager.settings("b").rate == 3
    # Clearing the model's rate falls back to the server's.
    assert manager.update("a", TraceUpdate(cleared=frozenset({"trace_rate"}))).rate == 3


async def test_model_level_off_stays_off_while_the_server_traces(manager: TraceManager):
    manager.update("a", TraceUpdate(level=TraceLevel.OFF))
    manager.update(None, TraceUpdate(level=ON, rate=1))
    assert manager.settings("a").level == TraceLevel.OFF
    assert manager.sample("a") is None
    assert manager.sample("b") is not None
    manager.update("a", TraceUpdate(cleared=frozenset({"trace_level"})))
    assert manager.settings("a").level == ON
    await manager.close(timeout_s=10)


async def test_clearing_the_server_goes_back_to_the_start_values(trace_file: Path):
    manager = TraceManager(
        TraceConfig(trace_file=str(trace_file), trace_rate=5, trace_level=("TIMESTAMPS",))
    )
    manager.update(None, TraceUpdate(level=TraceLevel.OFF, rate=9, count=4, log_frequency=2))
    everything = frozenset({"trace_level", "trace_rate", "trace_count", "log_frequency"})
    assert manager.update(None, TraceUpdate(cleared=everything)) == TraceValues(
        level=ON, rate=5, count=-1, log_frequency=0, file=str(trace_file)
    )
    await manager.close(timeout_s=10)


async def test_model_traces_are_sampled_under_the_models_setting(manager: TraceManager):
    manager.update("a", TraceUpdate(level=ON, rate=1))
    assert manager.is_active
    assert manager.sample("b") is None
    assert manager.sample("a") is not None
    manager.update("a", TraceUpdate(cleared=frozenset({"trace_level", "trace_rate"})))
    assert not manager.is_active
    await manager.close(timeout_s=10)


async def test_count_running_out_writes_a_numbered_file(manager: TraceManager, trace_file: Path):
    manager.update(None, TraceUpdate(level=ON, rate=1, count=3))
    serve(manager, Model("m"), 5)
    await manager.close(timeout_s=10)
    assert trace_ids(trace_file.with_name("trace.json.0")) == [1, 2, 3]
    assert written(trace_file) == ""


async def test_log_frequency_writes_every_n_traces(manager: TraceManager, trace_file: Path):
    manager.update(None, TraceUpdate(level=ON, rate=1, log_frequency=2))
    serve(manager, Model("m"), 5)
    await manager.close(timeout_s=10)
    numbered = [trace_ids(trace_file.with_name(f"trace.json.{n}")) for n in range(3)]
    assert numbered == [[1, 2], [3, 4], [5]]
    assert written(trace_file) == ""


async def test_without_log_frequency_traces_go_to_the_trace_file(
    manager: TraceManager, trace_file: Path
):
    manager.update(None, TraceUpdate(level=ON, rate=1))
    serve(manager, Model("m"), 2, request_id="r")
    # A change retires the setting: what it held is written; the next one goes on.
    manager.update(None, TraceUpdate(rate=1))
    serve(manager, Model("m"), 1)
    await manager.close(timeout_s=10)
    entries = read(trace_file)
    assert sorted({e["id"] for e in entries}) == [1, 2, 3]
    heads = [e for e in entries if "model_name" in e]
    assert heads[0] == {"id": 1, "model_name": "m", "model_version": 1, "request_id": "r"}
    assert heads[2] == {"id": 3, "model_name": "m", "model_version": 1}


async def test_a_full_buffer_goes_to_the_trace_file_early(trace_file: Path):
    manager = TraceManager(TraceConfig(trace_file=str(trace_file), trace_buffer_traces=2))
    manager.update(None, TraceUpdate(level=ON, rate=1))
    serve(manager, Model("m"), 3)
    # The first two are written before the server stops: the array is open until then.
    deadline = time.monotonic() + 10
    while not written(trace_file):
        assert time.monotonic() < deadline, "the first two traces were not written"
        await asyncio.sleep(0.01)
    early = json.loads(written(trace_file) + "]")
    assert sorted({e["id"] for e in early}) == [1, 2]
    await manager.close(timeout_s=10)
    assert trace_ids(trace_file) == [1, 2, 3]


async def test_timestamps_are_written_in_order_with_tritons_names(
    manager: TraceManager, trace_file: Path
):
    manager.update(None, TraceUpdate(level=ON, rate=1))
    serve(manager, Model("m", version=3), 1)
    await manager.close(timeout_s=10)
    entries = read(trace_file)
    assert entries[0] == {"id": 1, "model_name": "m", "model_version": 3}
    stamps = [e["timestamps"][0] for e in entries[1:]]
    assert [s["name"] for s in stamps] == TIMESTAMP_NAMES
    assert [s["ns"] for s in stamps] == [1000, 1020, 1030, 1040, 1090, 1100, 1200]


async def test_tensors_level_writes_inputs_and_outputs(manager: TraceManager, trace_file: Path):
    manager.update(None, TraceUpdate(level=TraceLevel.TENSORS, rate=1))
    serve(manager, Model("m"), 1)
    await manager.close(timeout_s=10)
    assert read(trace_file) == [
        {
            "id": 1,
            "activity": "TENSOR_QUEUE_INPUT",
            "tensor": {"name": "INPUT0", "data": "1,2", "shape": "1,2", "dtype": "FP32"},
        },
        {
            "id": 1,
            "activity": "TENSOR_BACKEND_OUTPUT",
            "tensor": {"name": "OUTPUT0", "data": "2,3.5", "shape": "1,2", "dtype": "FP32"},
        },
    ]


async def test_an_unwritable_trace_file_is_logged_and_serving_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    path = tmp_path / "missing-folder" / "trace.json"
    manager = TraceManager(TraceConfig(trace_file=str(path), trace_log_frequency=1))
    manager.update(None, TraceUpdate(level=ON, rate=1))
    with caplog.at_level(logging.ERROR, logger="data_plane.trace.writer"):
        assert serve(manager, Model("m"), 3) == 3
        await manager.close(timeout_s=10)
    failures = [r.getMessage() for r in caplog.records]
    assert len(failures) == 3
    assert all(m.startswith("failed writing 1 trace(s) to ") for m in failures)
    assert "No such file or directory" in failures[0]


async def test_writes_past_the_bound_are_dropped_and_logged(caplog: pytest.LogCaptureFixture):
    writer = TraceWriter(bound=1)
    release = threading.Event()
    done: list[str] = []

    def first() -> None:
        release.wait(10)
        done.append("first")

    with caplog.at_level(logging.WARNING, logger="data_plane.trace.writer"):
        writer.submit(first, "first")
        writer.submit(lambda: done.append("second"), "second")
        release.set()
        await writer.close(timeout_s=10)
    assert done == ["first"]
    assert writer.dropped == 1
    assert [r.getMessage() for r in caplog.records] == [
        "trace writes are behind (1 waiting): dropped second (1 dropped so far)"
    ]
