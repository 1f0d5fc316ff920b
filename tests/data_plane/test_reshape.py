"""``reshape``: the engine sees ``reshape.shape``, clients see ``dims`` (the answers real
Triton gives for the same configs are in test_differential_http.py)."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from data_plane.errors import InternalError
from data_plane.reshape import TensorReshape
from foundation import model_config
from foundation.proto import model_config_pb2 as mc
from tests.data_plane.server_app import data_plane
from tests.models import read_config, write_config, write_python_model

pytestmark = pytest.mark.anyio


def _reshape(text: str) -> TensorReshape:
    config = model_config.parse_pbtxt(text)
    model_config.normalize(config, name="m", gpu_count=0)
    reshape = TensorReshape.from_config(config)
    assert reshape is not None
    return reshape


@pytest.mark.parametrize(
    ("max_batch_size", "dims", "shape", "given", "engine"),
    [
        pytest.param(0, "[4]", "[2, 2]", (4,), (2, 2), id="fixed"),
        pytest.param(8, "[4]", "[2, 2]", (3, 4), (3, 2, 2), id="batch-kept"),
        pytest.param(8, "[1]", "[]", (5, 1), (5,), id="to-scalar"),
        pytest.param(0, "[-1, 6]", "[-1, 2, 3]", (7, 6), (7, 2, 3), id="variable-first"),
        pytest.param(0, "[6, -1]", "[2, 3, -1]", (6, 5), (2, 3, 5), id="variable-last"),
        pytest.param(2, "[-1, -1]", "[-1, -1]", (2, 3, 4), (2, 3, 4), id="two-variable"),
    ],
)
def test_inputs_reach_the_engine_reshaped_and_outputs_leave_as_dims(
    max_batch_size: int, dims: str, shape: str, given: tuple[int, ...], engine: tuple[int, ...]
):
    reshape = _reshape(
        f"max_batch_size: {max_batch_size} "
        f'input [{{ name: "I" data_type: TYPE_FP32 dims: {dims} reshape {{ shape: {shape} }} }}] '
        f'output [{{ name: "O" data_type: TYPE_FP32 dims: {dims} reshape {{ shape: {shape} }} }}]'
    )
    data = np.arange(int(np.prod(given)), dtype=np.float32).reshape(given)
    to_engine = reshape.to_model({"I": data, "other": data})
    assert to_engine["I"].shape == engine
    assert to_engine["other"] is data
    assert np.shares_memory(to_engine["I"], data)  # a view, not a copy
    back = reshape.from_model({"O": to_engine["I"]})
    assert back["O"].shape == given
    np.testing.assert_array_equal(back["O"], data)


def test_config_without_reshape_needs_no_reshaping():
    config = model_config.parse_pbtxt('input [{ name: "I" data_type: TYPE_FP32 dims: [4] }]')
    model_config.normalize(config, name="m", gpu_count=0)
    assert TensorReshape.from_config(config) is None


@pytest.mark.parametrize(
    "produced",
    [pytest.param((3, 4), id="rank"), pytest.param((3, 2, 3), id="size")],
)
def test_an_output_its_reshape_does_not_describe_is_the_engines_fault(produced):
    reshape = _reshape(
        'max_batch_size: 8 output [{ name: "O" data_type: TYPE_FP32 dims: [4] '
        "reshape { shape: [2, 2] } }]"
    )
    with pytest.raises(InternalError, match="model 'm' output 'O' has shape"):
        reshape.from_model({"O": np.zeros(produced, dtype=np.float32)})


SHAPES_MODEL = """\
import numpy as np


class TritonPythonModel:
    def execute(self, inputs):
        x = inputs["INPUT0"]
        shape = np.array(x.shape, dtype=np.int64)
        return {"OUTPUT0": x, "SHAPE": np.tile(shape, (x.shape[0], 1))}
"""
"""Answers its input and the shape it had inside the model."""


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    model_dir = write_python_model(root, "reshaped", SHAPES_MODEL, dims=(4,), max_batch_size=8)
    config = read_config(model_dir)
    config.input[0].reshape.shape.extend([2, 2])
    config.output[0].reshape.shape.extend([2, 2])
    config.output.add(name="SHAPE", data_type=mc.TYPE_INT64, dims=[-1])
    write_config(model_dir, config)
    return root


async def test_a_model_with_reshapes_answers_in_its_dims(repo: Path, tmp_path: Path):
    body = {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2, 4], "data": list(range(8))}]
    }
    async with data_plane(repo, tmp_path / "cache", load_models=("reshaped",)) as client:
        answer = await client.post("/v2/models/reshaped/infer", json=body)
        assert answer.status_code == 200, answer.text
        outputs = {o["name"]: o for o in answer.json()["outputs"]}
        # Inside the model the input was [2, 2, 2]; the output left it as [2, 2, 2] and the
        # client gets its dims back, batch first.
        assert outputs["SHAPE"]["data"] == [2, 2, 2, 2, 2, 2]
        assert outputs["OUTPUT0"]["shape"] == [2, 4]
        assert outputs["OUTPUT0"]["data"] == [float(v) for v in range(8)]
        # Clients still send the dims: the reshape is not a shape they may use.
        wrong = dict(body)
        wrong["inputs"] = [{**body["inputs"][0], "shape": [2, 2, 2]}]
        refused = await client.post("/v2/models/reshaped/infer", json=wrong)
        assert refused.status_code == 400
        assert "unexpected shape for input 'INPUT0'" in refused.json()["error"]
        metadata = (await client.get("/v2/models/reshaped")).json()
        assert metadata["inputs"][0]["shape"] == [-1, 4]
        assert metadata["outputs"][0]["shape"] == [-1, 4]


async def test_a_reshape_triton_refuses_fails_the_load(repo: Path, tmp_path: Path):
    config = read_config(repo / "reshaped")
    del config.input[0].reshape.shape[:]
    config.input[0].reshape.shape.extend([3])
    write_config(repo / "reshaped", config)
    async with data_plane(repo, tmp_path / "cache") as client:
        response = await client.post("/v2/repository/models/reshaped/load")
        assert response.status_code == 400
        assert response.json()["error"].endswith(
            "model input 'INPUT0' has different size for dims and reshape for reshaped"
        )


async def test_health_is_untouched_by_reshapes(repo: Path, tmp_path: Path):
    async with data_plane(repo, tmp_path / "cache", load_models=("reshaped",)) as client:
        assert isinstance(client, httpx.AsyncClient)
        assert (await client.get("/v2/health/ready")).status_code == 200
