"""The infer handler, called directly with decoded requests on real ONNX models: outputs
against the engine alone, output selection, Triton's validation texts, statistics and
dynamic batching."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from data_plane.errors import InvalidArgumentError, ServerStoppingError, UnknownModelError
from data_plane.protocol import InferInput, InferRequest, RequestedOutput
from tests.data_plane.server_app import Core, data_plane_core
from tests.models import load_mlp_weights, mlp_reference, write_onnx_add_sub, write_onnx_mlp

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # module scope: one core (one set of model loads) for the module


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    write_onnx_mlp(root, "mlp", sizes=(16, 32, 8), max_batch_size=32)
    write_onnx_add_sub(root, "simple", dtype="INT32", dims=(16,), max_batch_size=8)
    return root


@pytest.fixture(scope="module")
async def core(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Core]:
    cache = tmp_path_factory.mktemp("cache")
    async with data_plane_core(repo, cache, load_models=("mlp", "simple")) as core:
        yield core


def request(
    *inputs: InferInput, outputs: list[RequestedOutput] | None = None, id: str | None = None
) -> InferRequest:
    return InferRequest(
        id=id,
        inputs=list(inputs),
        outputs=outputs,
        parameters={},
        binary_data_output=False,
        priority=0,
        timeout_us=0,
    )


def tensor(name: str, data: np.ndarray, datatype: str = "FP32") -> InferInput:
    return InferInput(name=name, datatype=datatype, shape=data.shape, data=data)


async def test_outputs_match_the_engine_alone(core: Core, repo: Path):
    x = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    handler = core.handlers.infer
    response = await handler.infer(handler.model("mlp"), request(tensor("INPUT0", x), id="r7"))
    assert (response.model_name, response.model_version, response.id) == ("mlp", "1", "r7")
    [output] = response.outputs
    assert (output.name, output.datatype, output.binary) == ("OUTPUT0", "FP32", False)
    expected = mlp_reference(load_mlp_weights(repo / "mlp"), x)
    np.testing.assert_allclose(output.data, expected, rtol=1e-5, atol=1e-5)


async def test_only_the_outputs_asked_for_in_their_binary_form(core: Core):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    handler = core.handlers.infer
    response = await handler.infer(
        handler.model("simple", 1),
        request(
            tensor("INPUT0", a, "INT32"),
            tensor("INPUT1", b, "INT32"),
            outputs=[RequestedOutput("OUTPUT1", binary_data=True)],
        ),
    )
    [output] = response.outputs
    assert (output.name, output.binary) == ("OUTPUT1", True)
    np.testing.assert_array_equal(output.data, a - b)


async def test_a_draining_server_or_an_unknown_model_refuses_before_decoding(core: Core):
    handler = core.handlers.infer
    with pytest.raises(UnknownModelError, match="'nope' is not found"):
        handler.model("nope")
    core.lifecycle.is_stopping = True
    try:
        with pytest.raises(ServerStoppingError, match="Server is stopping"):
            handler.model("mlp")
    finally:
        core.lifecycle.is_stopping = False


ROW = np.zeros((1, 16), dtype=np.float32)


@pytest.mark.parametrize(
    ("model", "inputs", "message"),
    [
        pytest.param(
            "mlp",
            [tensor("BOGUS", ROW)],
            "unexpected inference input 'BOGUS' for model 'mlp'",
            id="unknown-tensor",
        ),
        pytest.param(
            "mlp",
            [tensor("INPUT0", np.zeros((1, 15), dtype=np.float32))],
            "unexpected shape for input 'INPUT0' for model 'mlp'. Expected [-1,16], got [1,15].",
            id="wrong-shape",
        ),
        pytest.param(
            "mlp",
            [tensor("INPUT0", ROW.astype(np.int32), "INT32")],
            "inference input 'INPUT0' data-type is 'INT32', but model 'mlp' expects 'FP32'",
            id="wrong-datatype",
        ),
        pytest.param(
            "mlp",
            [tensor("INPUT0", np.zeros((64, 16), dtype=np.float32))],
            "inference request batch-size must be <= 32 for 'mlp'",
            id="batch-too-large",
        ),
        pytest.param(
            "simple",
            [tensor("INPUT0", ROW.astype(np.int32), "INT32")],
            "expected 2 inputs but got 1 inputs for model 'simple'",
            id="missing-input",
        ),
        pytest.param(
            "mlp",
            [tensor("INPUT0", ROW)],
            "unexpected inference output 'NOPE' for model 'mlp'",
            id="unknown-output",
        ),
    ],
)
async def test_requests_that_do_not_fit_the_model_fail_with_tritons_text(
    core: Core, model: str, inputs: list[InferInput], message: str
):
    handler = core.handlers.infer
    loaded = handler.model(model)
    outputs = [RequestedOutput("NOPE")] if "output" in message else None
    failures = loaded.stats.failures["OTHER"]
    with pytest.raises(InvalidArgumentError) as raised:
        await handler.infer(loaded, request(*inputs, outputs=outputs, id="bad"))
    assert str(raised.value).startswith("[request id: bad] ")
    assert message in str(raised.value)
    assert loaded.stats.failures["OTHER"] == failures + 1


async def test_concurrent_requests_batch_and_each_gets_its_own_rows(core: Core, repo: Path):
    handler = core.handlers.infer
    model = handler.model("mlp")
    before = model.stats.inference_count, model.stats.execution_count
    xs = np.random.default_rng(5).standard_normal((64, 1, 16)).astype(np.float32)
    responses = await asyncio.gather(
        *(handler.infer(model, request(tensor("INPUT0", x), id=str(i))) for i, x in enumerate(xs))
    )
    expected = mlp_reference(load_mlp_weights(repo / "mlp"), xs.reshape(64, 16))
    for i, response in enumerate(responses):
        assert response.id == str(i)
        np.testing.assert_allclose(response.outputs[0].data[0], expected[i], rtol=1e-4, atol=1e-5)
    inferences = model.stats.inference_count - before[0]
    executions = model.stats.execution_count - before[1]
    assert inferences == 64
    assert executions < inferences
