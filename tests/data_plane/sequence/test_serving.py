"""Sequence models served over HTTP by the data plane, in process: an ONNX accumulator on
implicit state (both strategies), Python accumulators in Triton's and the dict contract, and
Triton's answers to bad sequence requests."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.data_plane.sequence.models import (
    DICT_ACCUMULATOR,
    DICT_STATE_ACCUMULATOR,
    STATE,
    write_onnx_accumulator,
    write_python_accumulator,
)
from tests.data_plane.server_app import data_plane

pytestmark = pytest.mark.anyio

MODELS = (
    "onnx_direct",
    "onnx_oldest",
    "onnx_single",
    "py_direct",
    "dict_direct",
    "dict_state",
    "onnx_idle",
)
IDLE_US = 300_000


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    repo = tmp_path / "repo"
    write_onnx_accumulator(repo, "onnx_direct")
    write_onnx_accumulator(repo, "onnx_oldest", strategy="oldest { max_candidate_sequences: 4 }")
    write_onnx_accumulator(repo, "onnx_single", max_batch_size=0)
    write_onnx_accumulator(repo, "onnx_idle", max_batch_size=1, idle_us=IDLE_US)
    write_python_accumulator(repo, "py_direct")
    write_python_accumulator(repo, "dict_direct", source=DICT_ACCUMULATOR, with_info=False)
    write_python_accumulator(
        repo, "dict_state", source=DICT_STATE_ACCUMULATOR, with_info=False, extra=STATE
    )
    async with data_plane(
        repo, tmp_path / "cache", load_models=MODELS, allowed_storage=()
    ) as http_client:
        yield http_client


def body(value: int, *, batching: bool = True, **parameters: Any) -> dict[str, Any]:
    shape = [1, 1] if batching else [1]
    return {
        "inputs": [{"name": "INPUT", "datatype": "INT32", "shape": shape, "data": [value]}],
        "parameters": parameters,
    }


async def infer(client: httpx.AsyncClient, model: str, value: int, **parameters: Any) -> Any:
    response = await client.post(
        f"/v2/models/{model}/infer",
        json=body(value, batching=model != "onnx_single", **parameters),
    )
    return response.status_code, response.json()


def output(answer: Any, name: str = "OUTPUT") -> Any:
    status, payload = answer
    assert status == 200, payload
    return next(o for o in payload["outputs"] if o["name"] == name)["data"]


async def run_sequence(
    client: httpx.AsyncClient, model: str, correlation_id: int | str, values: list[int]
) -> list[int]:
    sums = []
    for index, value in enumerate(values):
        flags: dict[str, Any] = {"sequence_id": correlation_id}
        if index == 0:
            flags["sequence_start"] = True
        if index == len(values) - 1:
            flags["sequence_end"] = True
        sums.append(output(await infer(client, model, value, **flags))[0])
    return sums


@pytest.mark.parametrize(
    "model", ["onnx_direct", "onnx_oldest", "onnx_single", "py_direct", "dict_state"]
)
async def test_start_steps_end(client: httpx.AsyncClient, model: str) -> None:
    assert await run_sequence(client, model, 42, [1, 2, 3, 4]) == [1, 3, 6, 10]
    # The same ID starts afresh after END.
    assert await run_sequence(client, model, 42, [5, 5]) == [5, 10]


@pytest.mark.parametrize(
    "model", ["onnx_direct", "onnx_oldest", "py_direct", "dict_direct", "dict_state"]
)
async def test_interleaved_sequences_keep_their_own_sums(
    client: httpx.AsyncClient, model: str
) -> None:
    ids: list[int | str] = [1, 2, "three", 4, 5, "six"]  # more than the slots: some wait
    results = await asyncio.gather(
        *(run_sequence(client, model, cid, [n + 1] * 5) for n, cid in enumerate(ids))
    )
    assert results == [[(n + 1) * k for k in range(1, 6)] for n in range(len(ids))]


async def test_the_model_sees_its_controls(client: httpx.AsyncClient) -> None:
    first = await infer(client, "py_direct", 1, sequence_id="abc", sequence_start=True)
    last = await infer(client, "py_direct", 1, sequence_id="abc", sequence_end=True)
    seen = [json.loads(output(a, "INFO")[0]) for a in (first, last)]
    # A string ID in a UINT64 CORRID: its length then its bytes, as Triton writes it.
    corrid = int.from_bytes(b"\x03\x00\x00\x00abc\x00", "little")
    assert seen == [
        {"ACC": None, "CORRID": [[corrid]], "END": [[0.0]], "READY": [[True]], "START": [[1]],
         "corr": "abc", "flags": 1},
        {"ACC": None, "CORRID": [[corrid]], "END": [[1.0]], "READY": [[True]], "START": [[0]],
         "corr": "abc", "flags": 2},
    ]  # fmt: skip
    echoed = await infer(client, "onnx_direct", 1, sequence_id=2**64 - 1, sequence_start=True)
    assert output(echoed, "CORRID_OUT") == [2**64 - 1]
    assert output(echoed, "READY_OUT") == [True]
    assert "ACC_OUT" not in {o["name"] for o in echoed[1]["outputs"]}


async def test_tritons_errors_for_bad_sequence_requests(client: httpx.AsyncClient) -> None:
    model = "onnx_direct"
    assert await infer(client, model, 1) == (
        400,
        {
            "error": "inference request to model 'onnx_direct' must specify a non-zero or "
            "non-empty correlation ID"
        },
    )
    not_started = (
        400,
        {
            "error": "inference request for sequence 77 to model 'onnx_direct' must specify the "
            "START flag on the first request of the sequence"
        },
    )
    assert await infer(client, model, 1, sequence_id=77) == not_started
    assert await infer(client, model, 1, sequence_id=77, sequence_start=True, sequence_end=True)
    assert await infer(client, model, 1, sequence_id=77, sequence_end=True) == not_started
    two_rows = {
        "inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [2, 1], "data": [1, 2]}],
        "parameters": {"sequence_id": 8, "sequence_start": True},
    }
    response = await client.post(f"/v2/models/{model}/infer", json=two_rows)
    assert (response.status_code, response.json()) == (
        400,
        {
            "error": "inference request to model 'onnx_direct' must specify batch-size 1 due to "
            "requirements of sequence batcher"
        },
    )
    too_big = await infer(client, model, 1, sequence_id=2**64, sequence_start=True)
    assert too_big[0] == 400 and "Unable to parse 'sequence_id'" in too_big[1]["error"]


async def test_an_idle_sequence_is_released(client: httpx.AsyncClient) -> None:
    model = "onnx_idle"
    assert output(await infer(client, model, 3, sequence_id=5, sequence_start=True)) == [3]
    # One slot: a second sequence waits until the first is released for being idle.
    second = await infer(client, model, 4, sequence_id=6, sequence_start=True)
    assert output(second) == [4]
    status, payload = await infer(client, model, 1, sequence_id=5)
    assert status == 400
    assert "must specify the START flag" in payload["error"]


async def test_config_shows_tritons_defaults(client: httpx.AsyncClient) -> None:
    config = (await client.get("/v2/models/onnx_oldest/config")).json()
    batching = config["sequence_batching"]
    assert batching["max_sequence_idle_microseconds"] == 1_000_000
    assert batching["oldest"]["preferred_batch_size"] == [2]
    assert [c["name"] for c in batching["control_input"]] == ["START", "END", "READY", "CORRID"]
    assert [i["name"] for i in config["input"]] == ["INPUT"]
    metadata = (await client.get("/v2/models/onnx_oldest")).json()
    assert [i["name"] for i in metadata["inputs"]] == ["INPUT"]
