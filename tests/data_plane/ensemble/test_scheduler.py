"""An ensemble request through its steps, with recording steps in place of models: the
order steps may run in, what each step is sent, what it hands on, and failures."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import numpy as np
import pytest

from data_plane.ensemble.scheduler import BoundStep, Ensemble, in_ensemble
from data_plane.errors import (
    InternalError,
    InvalidArgumentError,
    UnknownModelError,
    ZeroserveError,
)
from data_plane.model_version import LoadedVersion
from data_plane.protocol import InferRequest, OutputTensor, RequestedOutput
from data_plane.stats import ComputeTimes

pytestmark = pytest.mark.anyio

WAIT_S = 10.0
"""Bound on any wait for another step: a scheduler that serialized the steps fails the
test by timing out here instead of hanging."""


def bound(
    index: int,
    model: str,
    inputs: dict[str, str],
    outputs: dict[str, str],
    *,
    is_decoupled: bool = False,
) -> BoundStep:
    return BoundStep(
        index=index,
        model=model,
        version=None,
        inputs=tuple(inputs.items()),
        outputs=tuple(outputs.items()),
        requested=tuple(RequestedOutput(name) for name in outputs),
        is_decoupled=is_decoupled,
    )


class Models:
    """Stands for the repository and for inference: each model is a coroutine function
    from the step's request to its outputs, and every request is recorded."""

    def __init__(self, **models: Any) -> None:
        self.models = models
        self.requests: list[tuple[str, InferRequest]] = []

    def lookup(self, name: str, version: int | None = None) -> LoadedVersion:
        if name not in self.models:
            raise UnknownModelError(model=name)
        return cast(LoadedVersion, name)

    async def run_step(
        self, model: LoadedVersion, request: InferRequest, times: ComputeTimes
    ) -> list[OutputTensor]:
        name = cast(str, model)
        self.requests.append((name, request))
        times.add(input_ns=1, infer_ns=10, output_ns=100)
        outputs = await self.models[name](request)
        return [OutputTensor(n, "FP32", a, binary=False) for n, a in outputs.items()]


def request(**fields: Any) -> InferRequest:
    base: dict[str, Any] = dict(
        id=None,
        inputs=[],
        outputs=None,
        parameters={},
        binary_data_output=False,
        priority=0,
        timeout_us=0,
    )
    base.update(fields)
    return InferRequest(**base)


def doubled(source: str, target: str):
    async def model(sent: InferRequest) -> dict[str, np.ndarray]:
        (tensor,) = [t for t in sent.inputs if t.name == source]
        return {target: tensor.data * 2}

    return model


async def test_steps_with_their_inputs_ready_run_at_the_same_time():
    left_started, right_started = asyncio.Event(), asyncio.Event()

    async def left(sent: InferRequest) -> dict[str, np.ndarray]:
        left_started.set()
        await asyncio.wait_for(right_started.wait(), WAIT_S)
        return {"Y": sent.inputs[0].data + 1}

    async def right(sent: InferRequest) -> dict[str, np.ndarray]:
        right_started.set()
        await asyncio.wait_for(left_started.wait(), WAIT_S)
        return {"Y": sent.inputs[0].data + 2}

    async def join(sent: InferRequest) -> dict[str, np.ndarray]:
        by_name = {t.name: t.data for t in sent.inputs}
        return {"Z": by_name["A"] * by_name["B"]}

    models = Models(left=left, right=right, join=join)
    ensemble = Ensemble(
        "dag",
        [
            bound(0, "left", {"X": "IN"}, {"Y": "a"}),
            bound(1, "right", {"X": "IN"}, {"Y": "b"}),
            bound(2, "join", {"A": "a", "B": "b"}, {"Z": "OUT"}),
        ],
        {"IN": "FP32"},
        ["OUT"],
        models.lookup,
    )

    outputs = await ensemble.run(
        {"IN": np.array([1.0, 2.0], dtype=np.float32)}, request(), models.run_step, ComputeTimes()
    )

    np.testing.assert_array_equal(outputs["OUT"], [2.0 * 3.0, 3.0 * 4.0])
    assert [name for name, _ in models.requests][-1] == "join"


async def test_a_step_gets_the_arrays_the_step_before_produced_not_copies():
    produced = np.arange(4, dtype=np.float32)
    seen: list[np.ndarray] = []

    async def first(sent: InferRequest) -> dict[str, np.ndarray]:
        return {"Y": produced}

    async def second(sent: InferRequest) -> dict[str, np.ndarray]:
        seen.append(sent.inputs[0].data)
        return {"Y": sent.inputs[0].data}

    models = Models(first=first, second=second)
    given = np.ones(4, dtype=np.float32)
    ensemble = Ensemble(
        "chain",
        [
            bound(0, "first", {"X": "IN"}, {"Y": "mid"}),
            bound(1, "second", {"X": "mid"}, {"Y": "OUT"}),
        ],
        {"IN": "FP32"},
        ["OUT"],
        models.lookup,
    )

    outputs = await ensemble.run({"IN": given}, request(), models.run_step, ComputeTimes())

    assert models.requests[0][1].inputs[0].data is given
    assert seen[0] is produced
    assert outputs["OUT"] is produced


async def test_each_step_request_carries_the_ensemble_requests_id_parameters_and_priority():
    models = Models(only=doubled("X", "Y"))
    ensemble = Ensemble(
        "e", [bound(0, "only", {"X": "IN"}, {"Y": "OUT"})], {"IN": "FP32"}, ["OUT"], models.lookup
    )
    times = ComputeTimes()

    await ensemble.run(
        {"IN": np.ones((2, 3), dtype=np.float32)},
        request(id="r-1", parameters={"sequence_id": 7, "tag": "x"}, priority=2, timeout_us=500),
        models.run_step,
        times,
    )

    ((_, sent),) = models.requests
    assert (sent.id, sent.parameters, sent.priority, sent.timeout_us) == (
        "r-1",
        {"sequence_id": 7, "tag": "x"},
        2,
        500,
    )
    assert [(t.name, t.datatype, t.shape) for t in sent.inputs] == [("X", "FP32", (2, 3))]
    assert [o.name for o in sent.outputs or ()] == ["Y"]
    assert (times.input_ns, times.infer_ns, times.output_ns) == (1, 10, 100)


async def test_a_failing_step_fails_the_request_in_triton_words_and_stops_the_others():
    cancelled = asyncio.Event()
    blocked = asyncio.Event()

    async def slow(sent: InferRequest) -> dict[str, np.ndarray]:
        blocked.set()
        try:
            await asyncio.sleep(WAIT_S * 10)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return {}

    async def failing(sent: InferRequest) -> dict[str, np.ndarray]:
        await asyncio.wait_for(blocked.wait(), WAIT_S)
        raise InvalidArgumentError("negative input")

    models = Models(slow=slow, failing=failing)
    ensemble = Ensemble(
        "pipe",
        [
            bound(0, "slow", {"X": "IN"}, {"Y": "a"}),
            bound(1, "failing", {"X": "IN"}, {"Y": "b"}),
            bound(2, "slow", {"X": "a", "X2": "b"}, {"Y": "OUT"}),
        ],
        {"IN": "FP32"},
        ["OUT"],
        models.lookup,
    )

    with pytest.raises(InvalidArgumentError) as failed:
        await ensemble.run(
            {"IN": np.ones(1, dtype=np.float32)}, request(), models.run_step, ComputeTimes()
        )

    assert failed.value.message == "in ensemble 'pipe', negative input"
    assert str(failed.value) == failed.value.message
    assert cancelled.is_set()
    assert ensemble.running_count == 0


async def test_a_missing_composing_model_keeps_its_error_kind_and_fields():
    models = Models()
    ensemble = Ensemble(
        "e", [bound(0, "gone", {"X": "IN"}, {"Y": "OUT"})], {"IN": "FP32"}, ["OUT"], models.lookup
    )

    with pytest.raises(UnknownModelError) as failed:
        await ensemble.run(
            {"IN": np.ones(1, dtype=np.float32)}, request(), models.run_step, ComputeTimes()
        )

    assert failed.value.model == "gone"
    assert failed.value.message == "in ensemble 'e', Request for unknown model: 'gone' is not found"


async def test_a_step_that_leaves_out_a_mapped_output_fails_the_request():
    async def silent(sent: InferRequest) -> dict[str, np.ndarray]:
        return {}

    models = Models(silent=silent)
    ensemble = Ensemble(
        "e", [bound(0, "silent", {"X": "IN"}, {"Y": "OUT"})], {"IN": "FP32"}, ["OUT"], models.lookup
    )

    with pytest.raises(InternalError, match="^in ensemble 'e', model 'silent' did not produce"):
        await ensemble.run(
            {"IN": np.ones(1, dtype=np.float32)}, request(), models.run_step, ComputeTimes()
        )


async def test_an_optional_input_the_request_leaves_out_is_not_sent_to_the_step():
    models = Models(only=doubled("X", "Y"))
    ensemble = Ensemble(
        "e",
        [bound(0, "only", {"X": "IN", "EXTRA": "OPT"}, {"Y": "OUT"})],
        {"IN": "FP32", "OPT": "FP32"},
        ["OUT"],
        models.lookup,
    )

    await ensemble.run(
        {"IN": np.ones(1, dtype=np.float32)}, request(), models.run_step, ComputeTimes()
    )

    assert [t.name for t in models.requests[0][1].inputs] == ["X"]


async def test_wait_idle_waits_for_the_requests_in_flight():
    release, entered = asyncio.Event(), asyncio.Event()

    async def held(sent: InferRequest) -> dict[str, np.ndarray]:
        entered.set()
        await release.wait()
        return {"Y": sent.inputs[0].data}

    models = Models(held=held)
    ensemble = Ensemble(
        "e", [bound(0, "held", {"X": "IN"}, {"Y": "OUT"})], {"IN": "FP32"}, ["OUT"], models.lookup
    )
    running = asyncio.create_task(
        ensemble.run(
            {"IN": np.ones(1, dtype=np.float32)}, request(), models.run_step, ComputeTimes()
        )
    )
    await asyncio.wait_for(entered.wait(), WAIT_S)

    assert not await ensemble.wait_idle(0.01)
    release.set()
    assert await ensemble.wait_idle(WAIT_S)
    await running


def test_the_wrapped_error_is_a_zeroserve_error_of_the_same_class():
    wrapped = in_ensemble("outer", in_ensemble("inner", InvalidArgumentError("bad")))

    assert type(wrapped) is InvalidArgumentError
    assert isinstance(wrapped, ZeroserveError)
    assert wrapped.message == "in ensemble 'outer', in ensemble 'inner', bad"
