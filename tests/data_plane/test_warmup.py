"""model_warmup: samples read with Triton's checks and texts (measured against Triton 2.51,
which test_differential_http.py repeats), run on every instance before a version serves."""

from __future__ import annotations

import asyncio
import json
import struct
from pathlib import Path

import numpy as np
import pytest

from data_plane.errors import ModelLoadError
from data_plane.warmup import read_samples
from foundation import model_config
from tests.data_plane.server_app import data_plane
from tests.models import read_config, write_config, write_python_model

pytestmark = pytest.mark.anyio

PREFIX = "[request id: <id_unknown>] "


def _model_dir(tmp_path: Path, warmup: str, *, max_batch_size: int = 4, datatype: str = "FP32"):
    config = model_config.parse_pbtxt(
        f"max_batch_size: {max_batch_size} "
        f'input [{{ name: "INPUT0" data_type: TYPE_{datatype} dims: [3] }}] '
        f'output [{{ name: "OUTPUT0" data_type: TYPE_{datatype} dims: [3] }}] '
        f"model_warmup [{warmup}]"
    )
    model_config.normalize(config, name="w", gpu_count=0)
    model_dir = tmp_path / "w"
    (model_dir / "warmup").mkdir(parents=True)
    return config, model_dir


def _sample(inputs: str, *, batch_size: int = 1, name: str = "s") -> str:
    return f'{{ name: "{name}" batch_size: {batch_size} {inputs} }}'


def _input(data: str, *, key: str = "INPUT0", dims: str = "[3]", datatype: str = "FP32") -> str:
    return f'inputs {{ key: "{key}" value: {{ data_type: TYPE_{datatype} dims: {dims} {data} }} }}'


@pytest.mark.parametrize(
    ("warmup", "max_batch_size", "message"),
    [
        pytest.param(
            _sample(_input("zero_data: true", dims="[-1]")),
            4,
            f"Invalid argument: {PREFIX}warmup setting expects all variable-size dimensions "
            "are specified for input 'INPUT0'",
            id="variable-dims",
        ),
        pytest.param(
            _sample(_input("")),
            4,
            f"Invalid argument: {PREFIX}warmup setting expects input 'INPUT0' to have "
            "input_data_type set",
            id="no-data",
        ),
        pytest.param(
            _sample(_input('input_data_file: "in0"')),
            4,
            f"Invalid argument: {PREFIX}warmup setting expects 12 bytes, but the data provided "
            "from in0only has 8 bytes",
            id="short-file",
        ),
        pytest.param(
            _sample(_input("zero_data: true"), name="bb", batch_size=9),
            4,
            "Invalid argument: failed to run warmup sample 'bb': batch size 9 for 'w', max "
            "allowed is 4",
            id="batch-too-large",
        ),
        pytest.param(
            _sample(_input("zero_data: true"), name="a", batch_size=2),
            0,
            "Invalid argument: failed to run warmup sample 'a': batch size 2 for 'w', max "
            "allowed is 0",
            id="batch-without-batching",
        ),
        pytest.param(
            _sample(_input("zero_data: true", key="NOPE")),
            4,
            f"Invalid argument: {PREFIX}expected 1 inputs but got 0 inputs for model 'w'. Got "
            "input(s) [], but missing required input(s) ['INPUT0']. Please provide all required "
            "input(s).",
            id="missing-input",
        ),
        pytest.param(
            _sample(_input("zero_data: true", datatype="INT32")),
            4,
            f"Invalid argument: {PREFIX}inference input 'INPUT0' data-type is 'INT32', but model "
            "'w' expects 'FP32'",
            id="datatype",
        ),
        pytest.param(
            _sample(_input("zero_data: true", dims="[5]")),
            4,
            f"Invalid argument: {PREFIX}unexpected shape for input 'INPUT0' for model 'w'. "
            "Expected [-1,3], got [1,5]. NOTE: Setting a non-zero max_batch_size in the model "
            "config requires a batch dimension to be prepended to each input shape. If you "
            "want to specify the full shape including the batch dim in your input dims config, "
            "try setting max_batch_size to zero. See the model configuration docs for more info "
            "on max_batch_size.",
            id="dims",
        ),
        pytest.param(
            _sample(_input('input_data_file: "../config.pbtxt"')),
            4,
            "Invalid argument: 'input_data_file' must be the name of a file in the model's "
            "warmup folder, not a path: '../config.pbtxt'",
            id="path-refused",
        ),
    ],
)
def test_bad_warmup_settings_get_tritons_texts(tmp_path, warmup, max_batch_size, message):
    config, model_dir = _model_dir(tmp_path, warmup, max_batch_size=max_batch_size)
    (model_dir / "warmup" / "in0").write_bytes(b"12345678")
    with pytest.raises(ModelLoadError) as raised:
        read_samples(config, model_dir)
    assert raised.value.reason == message


def test_a_missing_file_is_tritons_internal_error(tmp_path):
    config, model_dir = _model_dir(tmp_path, _sample(_input('input_data_file: "missing"')))
    with pytest.raises(ModelLoadError) as raised:
        read_samples(config, model_dir)
    path = model_dir / "warmup" / "missing"
    assert raised.value.reason == (
        f"Internal: failed to open text file for read {path}: No such file or directory"
    )


def test_samples_hold_the_data_asked_for(tmp_path):
    warmup = ", ".join(
        [
            _sample(_input("zero_data: true"), name="zero", batch_size=2),
            _sample(_input('input_data_file: "in0"'), name="file"),
            _sample(_input("random_data: true"), name="random", batch_size=3),
            _sample(_input("zero_data: true"), name="none", batch_size=0),
            _sample(_input("zero_data: true") + " " + _input("zero_data: true", key="EXTRA")),
        ]
    )
    config, model_dir = _model_dir(tmp_path, warmup)
    config.model_warmup[0].count = 3
    (model_dir / "warmup" / "in0").write_bytes(np.array([1, 2, 3], "<f4").tobytes() + b"more")
    zero, file, random, extra = read_samples(config, model_dir)
    assert (zero.name, zero.rows, zero.count) == ("zero", 2, 3)
    np.testing.assert_array_equal(zero.inputs["INPUT0"], np.zeros((2, 3), np.float32))
    np.testing.assert_array_equal(file.inputs["INPUT0"], [[1.0, 2.0, 3.0]])
    assert file.count == 1  # 0 means once
    assert random.inputs["INPUT0"].shape == (3, 3) and np.isfinite(random.inputs["INPUT0"]).all()
    # Batch size 0 runs nothing; an input the model lacks is not sent.
    assert list(extra.inputs) == ["INPUT0"]


def test_bytes_samples(tmp_path):
    warmup = ", ".join(
        [
            _sample(_input("zero_data: true", datatype="STRING")),
            _sample(_input("random_data: true", datatype="STRING")),
            _sample(_input('input_data_file: "s"', datatype="STRING")),
        ]
    )
    config, model_dir = _model_dir(tmp_path, warmup, max_batch_size=0, datatype="STRING")
    elements = [b"ab", b"c", b"def"]
    (model_dir / "warmup" / "s").write_bytes(
        b"".join(struct.pack("<I", len(e)) + e for e in elements)
    )
    zero, random, file = read_samples(config, model_dir)
    # Triton sends empty strings for zero and random data alike.
    assert zero.inputs["INPUT0"].tolist() == [b"", b"", b""]
    assert random.inputs["INPUT0"].tolist() == [b"", b"", b""]
    assert file.inputs["INPUT0"].tolist() == elements


LOGGING_MODEL = """\
import json
import os
import time


class TritonPythonModel:
    def initialize(self, args):
        self.folder = args["model_repository"]

    def execute(self, inputs):
        x = inputs["INPUT0"]
        gate = os.path.join(self.folder, "gate")
        deadline = time.monotonic() + 30
        while not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.01)
        if x.size and x.flatten()[0] == 7:
            raise RuntimeError("seven is not warm")
        with open(os.path.join(self.folder, "executions.log"), "a") as log:
            log.write(json.dumps({"shape": list(x.shape), "sum": float(x.sum())}) + "\\n")
        return {"OUTPUT0": x}
"""
"""Logs each execution; waits for a ``gate`` file first, so that a test can look at the
server while the warmup runs."""


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    model_dir = write_python_model(
        root, "warm", LOGGING_MODEL, dims=(3,), max_batch_size=4, instance_count=2
    )
    config = read_config(model_dir)
    config.ClearField("dynamic_batching")
    warmup = config.model_warmup.add(name="zeros", batch_size=2, count=2)
    warmup.inputs["INPUT0"].data_type = config.input[0].data_type
    warmup.inputs["INPUT0"].dims.append(3)
    warmup.inputs["INPUT0"].zero_data = True
    write_config(model_dir, config)
    return root


def _executions(repo: Path) -> list[dict[str, object]]:
    log = repo / "warm" / "executions.log"
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


async def test_warmup_runs_on_every_instance_before_the_model_is_ready(repo, tmp_path):
    async with data_plane(repo, tmp_path / "cache") as client:
        load = asyncio.create_task(client.post("/v2/repository/models/warm/load"))
        for _ in range(3000):  # the load reaches its warmup within 30 s
            if (await client.post("/v2/repository/index")).json()[0].get("state") is not None:
                break
            await asyncio.sleep(0.01)
        # Loaded, warming up: not ready yet, and nothing of it serves.
        assert (await client.get("/v2/models/warm/ready")).status_code == 400
        [row] = (await client.post("/v2/repository/index")).json()
        assert row["state"] == "LOADING"
        (repo / "warm" / "gate").touch()
        response = await load
        assert response.status_code == 200, response.text
        # count 2 on each of the 2 instances, a batch of 2 rows of zeros each time.
        assert _executions(repo) == [{"shape": [2, 3], "sum": 0.0}] * 4
        assert (await client.get("/v2/models/warm/ready")).status_code == 200


async def test_a_warmup_that_fails_fails_the_load(repo, tmp_path):
    (repo / "warm" / "gate").touch()
    config = read_config(repo / "warm")
    sample = config.model_warmup[0]
    sample.inputs["INPUT0"].ClearField("zero_data")
    sample.inputs["INPUT0"].input_data_file = "sevens"
    write_config(repo / "warm", config)
    (repo / "warm" / "warmup").mkdir()
    (repo / "warm" / "warmup" / "sevens").write_bytes(np.full(3, 7, "<f4").tobytes())
    async with data_plane(repo, tmp_path / "cache") as client:
        response = await client.post("/v2/repository/models/warm/load")
        assert response.status_code == 400
        message = response.json()["error"]
        assert message.startswith(
            "load failed for model 'warm': version 1 is at UNAVAILABLE state: Internal: failed "
            "to run warmup sample 'zeros': "
        )
        assert "seven is not warm" in message
        [row] = (await client.post("/v2/repository/index")).json()
        assert (row["state"], row["reason"].startswith("Internal: failed to run warmup")) == (
            "UNAVAILABLE",
            True,
        )
        assert (await client.get("/v2/health/ready")).status_code == 200
