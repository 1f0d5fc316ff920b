"""``tritonclient.grpc``, unchanged, against the data plane's gRPC listener in process:
health and metadata, inference (sync, async_infer, the aio client, streams) on real ONNX
models with every datatype, classification, statistics, and the errors a client sees."""

from __future__ import annotations

import asyncio
import base64
import queue
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

grpcclient = pytest.importorskip("tritonclient.grpc")
grpcaio = pytest.importorskip("tritonclient.grpc.aio")
from tritonclient.utils import InferenceServerException  # noqa: E402

from tests.data_plane.grpc.serving import GrpcServing, serving  # noqa: E402
from tests.models import (  # noqa: E402
    ONNX_ELEM_TYPES,
    load_mlp_weights,
    mlp_reference,
    write_onnx_add_sub,
    write_onnx_identity,
    write_onnx_mlp,
)

STREAM_TIMEOUT_S = 60.0

# The numpy type tritonclient takes and gives back for each datatype.
NUMPY_TYPES: dict[str, Any] = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BF16": ml_dtypes.bfloat16,  # tritonclient >= r26.06 takes BF16 only as ml_dtypes'
    "BYTES": np.object_,
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    write_onnx_add_sub(root, "add_sub", dtype="FP32", dims=(16,), max_batch_size=8)
    write_onnx_add_sub(root, "add_sub_int32", dtype="INT32", dims=(16,), max_batch_size=8)
    write_onnx_mlp(root, "mlp", sizes=(16, 32, 8), max_batch_size=32)
    for datatype in ONNX_ELEM_TYPES:
        write_onnx_identity(root, f"identity_{datatype.lower()}", datatype=datatype)
    return root


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcServing]:
    with serving(repo, tmp_path_factory.mktemp("cache"), load_models=("*",)) as running:
        yield running


@pytest.fixture
def client(server: GrpcServing) -> Iterator[Any]:
    c = grpcclient.InferenceServerClient(server.address)
    try:
        yield c
    finally:
        c.close()


def add_sub_inputs(a: np.ndarray, b: np.ndarray, datatype: str = "FP32") -> list[Any]:
    inputs = [
        grpcclient.InferInput("INPUT0", list(a.shape), datatype),
        grpcclient.InferInput("INPUT1", list(b.shape), datatype),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def sample(datatype: str, shape: tuple[int, ...] = (2, 5)) -> np.ndarray:
    rng = np.random.default_rng(7)
    if datatype == "BYTES":
        values = [f"s{i}-é".encode() for i in range(int(np.prod(shape)))]
        values[0] = b""
        return np.array(values, dtype=object).reshape(shape)
    if datatype == "BOOL":
        return rng.integers(0, 2, shape).astype(bool)
    numpy_type = NUMPY_TYPES[datatype]
    if np.issubdtype(numpy_type, np.integer):
        info = np.iinfo(numpy_type)
        return rng.integers(info.min, info.max, shape, dtype=numpy_type, endpoint=True)
    return rng.standard_normal(shape).astype(numpy_type)


def test_health_and_metadata(client) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("add_sub")
    assert client.is_model_ready("add_sub", "1")
    assert not client.is_model_ready("no_such_model")
    assert not client.is_model_ready("add_sub", "7")
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "triton"
    assert "statistics" in meta["extensions"]
    model = client.get_model_metadata("add_sub", as_json=True)
    assert model["name"] == "add_sub"
    assert model["versions"] == ["1"]
    assert model["platform"] == "onnxruntime"
    assert [(t["name"], t["datatype"], t["shape"]) for t in model["inputs"]] == [
        ("INPUT0", "FP32", ["-1", "16"]),
        ("INPUT1", "FP32", ["-1", "16"]),
    ]
    config = client.get_model_config("add_sub").config
    assert config.name == "add_sub"
    assert config.max_batch_size == 8
    assert [i.name for i in config.input] == ["INPUT0", "INPUT1"]


@pytest.mark.parametrize("datatype", ["FP32", "INT32"])
def test_add_sub(client, datatype: str) -> None:
    numpy_type = NUMPY_TYPES[datatype]
    a = np.arange(32, dtype=numpy_type).reshape(2, 16)
    b = np.full((2, 16), 3, dtype=numpy_type)
    model = "add_sub" if datatype == "FP32" else "add_sub_int32"
    result = client.infer(model, add_sub_inputs(a, b, datatype), request_id="req-1")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    response = result.get_response()
    assert response.id == "req-1"
    assert response.model_name == model
    assert response.model_version == "1"


def test_mlp_matches_numpy(client, repo: Path) -> None:
    x = np.random.default_rng(3).standard_normal((5, 16)).astype(np.float32)
    request = grpcclient.InferInput("INPUT0", [5, 16], "FP32")
    request.set_data_from_numpy(x)
    result = client.infer("mlp", [request])
    expected = mlp_reference(load_mlp_weights(repo / "mlp"), x)
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("datatype", sorted(ONNX_ELEM_TYPES))
def test_every_datatype_round_trips(client, datatype: str) -> None:
    data = sample(datatype)
    tensor = grpcclient.InferInput("INPUT0", list(data.shape), datatype)
    tensor.set_data_from_numpy(data)
    result = client.infer(f"identity_{datatype.lower()}", [tensor])
    output = result.as_numpy("OUTPUT0")
    assert output.shape == data.shape
    if datatype == "BYTES":
        assert output.tolist() == data.tolist()
    else:
        assert output.dtype == data.dtype
        np.testing.assert_array_equal(output.astype(np.float64), data.astype(np.float64))


def test_requested_outputs_and_classification(client) -> None:
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.zeros((1, 16), dtype=np.float32)
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0", class_count=3)]
    result = client.infer("add_sub", add_sub_inputs(a, b), outputs=outputs)
    response = result.get_response()
    assert [o.name for o in response.outputs] == ["OUTPUT0"]
    classes = result.as_numpy("OUTPUT0")
    assert classes.shape == (1, 3)
    assert classes.tolist() == [[b"15.000000:15", b"14.000000:14", b"13.000000:13"]]
    only_second = client.infer(
        "add_sub", add_sub_inputs(a, b), outputs=[grpcclient.InferRequestedOutput("OUTPUT1")]
    )
    assert [o.name for o in only_second.get_response().outputs] == ["OUTPUT1"]
    np.testing.assert_array_equal(only_second.as_numpy("OUTPUT1"), a)


def test_parameters_and_priority(client) -> None:
    a = np.ones((1, 16), dtype=np.float32)
    result = client.infer(
        "add_sub",
        add_sub_inputs(a, a),
        priority=1,
        timeout=10_000_000,
        parameters={"custom_int": 3, "custom_text": "x", "custom_flag": True},
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)


def test_async_infer_many_at_once(client) -> None:
    answers: queue.Queue[tuple[int, Any, Any]] = queue.Queue()
    count = 24
    for i in range(count):
        a = np.full((1, 16), i, dtype=np.float32)

        def done(result: Any, error: Any, i: int = i) -> None:
            answers.put((i, result, error))

        client.async_infer("add_sub", add_sub_inputs(a, a), done, request_id=str(i))
    seen = set()
    for _ in range(count):
        i, result, error = answers.get(timeout=STREAM_TIMEOUT_S)
        assert error is None
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 16), 2 * i))
        seen.add(i)
    assert seen == set(range(count))


def test_aio_client(server: GrpcServing) -> None:
    async def run() -> list[np.ndarray]:
        aio = grpcaio.InferenceServerClient(server.address)
        try:
            assert await aio.is_server_ready()
            assert await aio.is_model_ready("add_sub")
            calls = []
            for i in range(8):
                a = np.full((1, 16), i, dtype=np.float32)
                inputs = [
                    grpcaio.InferInput("INPUT0", [1, 16], "FP32"),
                    grpcaio.InferInput("INPUT1", [1, 16], "FP32"),
                ]
                inputs[0].set_data_from_numpy(a)
                inputs[1].set_data_from_numpy(a)
                calls.append(aio.infer("add_sub", inputs))
            results = await asyncio.gather(*calls)
            return [r.as_numpy("OUTPUT0") for r in results]
        finally:
            await aio.close()

    outputs = asyncio.run(run())
    for i, output in enumerate(outputs):
        np.testing.assert_array_equal(output, np.full((1, 16), 2 * i))


def test_stream_answers_each_request_and_survives_errors(client) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for i in range(10):
            a = np.full((1, 16), i, dtype=np.float32)
            model = "no_such_model" if i == 4 else "add_sub"
            client.async_stream_infer(model, add_sub_inputs(a, a), request_id=f"r{i}")
        bad_shape = np.ones((1, 15), dtype=np.float32)
        client.async_stream_infer("add_sub", add_sub_inputs(bad_shape, bad_shape), request_id="bad")
        results: dict[str, Any] = {}
        errors: list[Any] = []
        for _ in range(11):
            result, error = answers.get(timeout=STREAM_TIMEOUT_S)
            if error is not None:
                errors.append(error)
            else:
                results[result.get_response().id] = result
    finally:
        client.stop_stream()
    assert sorted(results) == sorted(f"r{i}" for i in range(10) if i != 4)
    for request_id, result in results.items():
        i = int(request_id[1:])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 16), 2 * i))
        final = result.get_response().parameters["triton_final_response"]
        assert final.bool_param is True
    messages = sorted(str(e.message()) for e in errors)
    assert messages[0] == "Request for unknown model: 'no_such_model' is not found"
    assert messages[1].startswith(
        "[request id: bad] unexpected shape for input 'INPUT0' for model 'add_sub'"
    )


def test_bytes_from_strings(client) -> None:
    data = np.array([["héllo", "wörld", ""]], dtype=object)
    tensor = grpcclient.InferInput("INPUT0", [1, 3], "BYTES")
    tensor.set_data_from_numpy(data)
    output = client.infer("identity_bytes", [tensor]).as_numpy("OUTPUT0")
    assert output.tolist() == [["héllo".encode(), "wörld".encode(), b""]]


def test_statistics(client) -> None:
    before = client.get_inference_statistics("mlp").model_stats[0]
    x = np.zeros((3, 16), dtype=np.float32)
    tensor = grpcclient.InferInput("INPUT0", [3, 16], "FP32")
    tensor.set_data_from_numpy(x)
    client.infer("mlp", [tensor])
    after = client.get_inference_statistics("mlp", "1").model_stats[0]
    assert after.name == "mlp"
    assert after.version == "1"
    assert after.inference_stats.success.count == before.inference_stats.success.count + 1
    assert after.inference_count == before.inference_count + 3
    assert after.inference_stats.success.ns > 0
    every = client.get_inference_statistics(as_json=True)["model_stats"]
    assert {"mlp", "add_sub"} <= {s["name"] for s in every}
    with pytest.raises(InferenceServerException) as raised:
        client.get_inference_statistics("no_such_model")
    assert raised.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert raised.value.message() == "requested model 'no_such_model' is not available"


def test_errors_carry_tritons_codes_and_texts(client) -> None:
    a = np.ones((1, 16), dtype=np.float32)
    cases: list[tuple[Callable[[], object], str, str]] = [
        (
            lambda: client.infer("no_such_model", add_sub_inputs(a, a)),
            "StatusCode.NOT_FOUND",
            "Request for unknown model: 'no_such_model' is not found",
        ),
        (
            lambda: client.infer("add_sub", add_sub_inputs(a, a), model_version="3"),
            "StatusCode.NOT_FOUND",
            "Request for unknown model: 'add_sub' version 3 is not found",
        ),
        (
            lambda: client.infer("add_sub", add_sub_inputs(a, a), model_version="x"),
            "StatusCode.INVALID_ARGUMENT",
            "failed to get model version from specified version string 'x' (details: stol), "
            "version should be an integral value > 0",
        ),
        (
            lambda: client.infer("add_sub", add_sub_inputs(a, a)[:1]),
            "StatusCode.INVALID_ARGUMENT",
            "[request id: <id_unknown>] expected 2 inputs but got 1 inputs for model "
            "'add_sub'. Got input(s) ['INPUT0'], but missing required input(s) ['INPUT1']. "
            "Please provide all required input(s).",
        ),
        (
            lambda: client.get_model_metadata("no_such_model"),
            "StatusCode.NOT_FOUND",
            "Request for unknown model: 'no_such_model' is not found",
        ),
        (
            lambda: client.update_trace_settings(settings={"trace_file": "/tmp/trace.json"}),
            "StatusCode.UNIMPLEMENTED",
            "trace file location can not be updated through network protocol",
        ),
        (
            lambda: client.get_trace_settings(model_name="no_such_model"),
            "StatusCode.INVALID_ARGUMENT",
            "Request for unknown model : no_such_model",
        ),
        (
            lambda: client.update_log_settings(settings={"log_format": "xml"}),
            "StatusCode.INVALID_ARGUMENT",
            "invalid argument for log_format, got: xml",
        ),
        (
            lambda: client.register_cuda_shared_memory(
                "region", base64.b64encode(b"handle"), 0, 64
            ),
            "StatusCode.INVALID_ARGUMENT",
            "failed to register shared memory region: invalid args (this server has no CUDA "
            "runtime to open CUDA IPC handles with)",
        ),
    ]
    for call, status, message in cases:
        with pytest.raises(InferenceServerException) as raised:
            call()
        assert (raised.value.status(), raised.value.message()) == (status, message)
    assert client.get_cuda_shared_memory_status(as_json=True) == {}
    client.unregister_cuda_shared_memory()
    assert client.is_server_ready()


def test_trace_and_log_settings(client) -> None:
    server = client.get_trace_settings(as_json=True)["settings"]
    assert server["trace_level"]["value"] == ["OFF"]
    assert server["trace_rate"]["value"] == ["1000"]
    assert server["trace_mode"]["value"] == ["triton"]
    changed = client.update_trace_settings(
        model_name="mlp", settings={"trace_rate": "5", "trace_count": "10"}, as_json=True
    )["settings"]
    assert (changed["trace_rate"]["value"], changed["trace_count"]["value"]) == (["5"], ["10"])
    assert client.get_trace_settings(as_json=True)["settings"]["trace_rate"]["value"] == ["1000"]
    cleared = client.update_trace_settings(
        model_name="mlp", settings={"trace_rate": None, "trace_count": None}, as_json=True
    )["settings"]
    assert cleared["trace_rate"]["value"] == ["1000"]
    # Reading only: a change would reach the test process's own logging.
    logging_now = client.get_log_settings(as_json=True)["settings"]
    assert set(logging_now) == {
        "log_file",
        "log_info",
        "log_warning",
        "log_error",
        "log_verbose_level",
        "log_format",
    }
    assert logging_now["log_format"] == {"string_param": "default"}
