"""System shared memory over gRPC with ``tritonclient.grpc`` and
``tritonclient.utils.shared_memory``, unchanged: the client repository's
``simple_grpc_shm_client`` and ``simple_grpc_shm_string_client`` flows, and Triton's codes
and texts for bad regions, with the server serving on after each."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

grpcclient = pytest.importorskip("tritonclient.grpc")
shm = pytest.importorskip("tritonclient.utils.shared_memory")
from tritonclient.utils import (  # noqa: E402
    InferenceServerException,
    serialize_byte_tensor,
    serialized_byte_size,
)

from tests.data_plane.grpc.serving import GrpcServing, serving  # noqa: E402
from tests.models import write_onnx_add_sub, write_onnx_identity  # noqa: E402

TENSOR_BYTES = 64  # one [1, 16] INT32 tensor


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcServing]:
    repo = tmp_path_factory.mktemp("repo")
    write_onnx_add_sub(repo, "simple", dtype="INT32", dims=(16,), max_batch_size=8)
    write_onnx_identity(repo, "strings", datatype="BYTES", dims=(-1,), max_batch_size=8)
    with serving(repo, tmp_path_factory.mktemp("cache"), load_models=("*",)) as running:
        yield running


@pytest.fixture
def client(server: GrpcServing) -> Iterator[Any]:
    c = grpcclient.InferenceServerClient(server.address)
    try:
        yield c
    finally:
        c.unregister_system_shared_memory()
        c.close()


@pytest.fixture
def create() -> Iterator[Callable[[str, int], tuple[str, Any]]]:
    """Make a client region of a byte size under a fresh key: (key, handle); all are
    destroyed after the test."""
    made: list[Any] = []

    def make(name: str, byte_size: int) -> tuple[str, Any]:
        key = f"/zs-grpc-{name}-{uuid.uuid4().hex[:8]}"
        handle = shm.create_shared_memory_region(name, key, byte_size)
        made.append(handle)
        return key, handle

    try:
        yield make
    finally:
        for handle in made:
            shm.destroy_shared_memory_region(handle)


def simple_inputs(region: str, byte_size: int = TENSOR_BYTES) -> list[Any]:
    inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_shared_memory(region, byte_size)
    inputs[1].set_shared_memory(region, byte_size, offset=TENSOR_BYTES)
    return inputs


def test_simple_grpc_shm_client_flow(client, create) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    in_key, in_handle = create("input_data", 2 * TENSOR_BYTES)
    out_key, out_handle = create("output_data", 2 * TENSOR_BYTES)
    shm.set_shared_memory_region(in_handle, [a, b])
    client.register_system_shared_memory("input_data", in_key, 2 * TENSOR_BYTES)
    client.register_system_shared_memory("output_data", out_key, 2 * TENSOR_BYTES)
    status = client.get_system_shared_memory_status(as_json=True)["regions"]
    assert status["input_data"] == {
        "name": "input_data",
        "key": in_key,
        "byte_size": str(2 * TENSOR_BYTES),
    }
    outputs = [grpcclient.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
    outputs[0].set_shared_memory("output_data", TENSOR_BYTES)
    outputs[1].set_shared_memory("output_data", TENSOR_BYTES, offset=TENSOR_BYTES)
    result = client.infer("simple", simple_inputs("input_data"), outputs=outputs)
    response = result.get_response()
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
        ("OUTPUT0", "INT32", [1, 16]),
        ("OUTPUT1", "INT32", [1, 16]),
    ]
    assert list(response.raw_output_contents) == [b"", b""]
    sums = shm.get_contents_as_numpy(out_handle, np.int32, [1, 16])
    differences = shm.get_contents_as_numpy(out_handle, np.int32, [1, 16], offset=TENSOR_BYTES)
    np.testing.assert_array_equal(sums, a + b)
    np.testing.assert_array_equal(differences, a - b)
    client.unregister_system_shared_memory("input_data")
    assert "input_data" not in client.get_system_shared_memory_status(as_json=True)["regions"]


def test_inputs_in_shared_memory_outputs_in_the_response(client, create) -> None:
    a = np.full((1, 16), 5, dtype=np.int32)
    key, handle = create("inputs_only", 2 * TENSOR_BYTES)
    shm.set_shared_memory_region(handle, [a, a])
    client.register_system_shared_memory("inputs_only", key, 2 * TENSOR_BYTES)
    result = client.infer("simple", simple_inputs("inputs_only"))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)


def test_simple_grpc_shm_string_client_flow(client, create) -> None:
    data = np.array([[b"zero", "é".encode(), b"", b"three"]], dtype=object)
    serialized = serialize_byte_tensor(data)
    size = serialized_byte_size(serialized)
    in_key, in_handle = create("strings_in", size)
    out_key, out_handle = create("strings_out", size)
    shm.set_shared_memory_region(in_handle, [serialized])
    client.register_system_shared_memory("strings_in", in_key, size)
    client.register_system_shared_memory("strings_out", out_key, size)
    tensor = grpcclient.InferInput("INPUT0", [1, 4], "BYTES")
    tensor.set_shared_memory("strings_in", size)
    output = grpcclient.InferRequestedOutput("OUTPUT0")
    output.set_shared_memory("strings_out", size)
    client.infer("strings", [tensor], outputs=[output])
    back = shm.get_contents_as_numpy(out_handle, np.object_, [1, 4])
    assert back.tolist() == data.tolist()


def test_bad_regions_get_tritons_codes(client, create) -> None:
    key, _ = create("bad", 2 * TENSOR_BYTES)
    small_key, _ = create("small", 32)
    client.register_system_shared_memory("bad", key, 2 * TENSOR_BYTES)
    client.register_system_shared_memory("small", small_key, 32)
    too_small = [grpcclient.InferRequestedOutput("OUTPUT0")]
    too_small[0].set_shared_memory("small", 32)
    past_end = simple_inputs("bad")
    past_end[1].set_shared_memory("bad", TENSOR_BYTES, offset=2 * TENSOR_BYTES)
    cases: list[tuple[Callable[[], object], str, str]] = [
        (
            lambda: client.register_system_shared_memory("bad", key, 8),
            "StatusCode.ALREADY_EXISTS",
            "shared memory region 'bad' already in manager",
        ),
        (
            lambda: client.get_system_shared_memory_status("nope"),
            "StatusCode.NOT_FOUND",
            "Unable to find system shared memory region: 'nope'",
        ),
        (
            lambda: client.register_system_shared_memory("missing", "/zs-grpc-no-such-key", 8),
            "StatusCode.INTERNAL",
            "Unable to open shared memory region: '/zs-grpc-no-such-key'",
        ),
        (
            lambda: client.infer("simple", simple_inputs("nope")),
            "StatusCode.NOT_FOUND",
            "Unable to find shared memory region: 'nope'",
        ),
        (
            lambda: client.infer("simple", simple_inputs("bad"), outputs=too_small),
            "StatusCode.INTERNAL",
            "shared memory size specified with the request for output 'OUTPUT0' (32 bytes) "
            "should be at least 64 bytes to hold the results",
        ),
    ]
    for call, status, message in cases:
        with pytest.raises(InferenceServerException) as raised:
            call()
        assert (raised.value.status(), raised.value.message()) == (status, message)
    with pytest.raises(InferenceServerException) as raised:
        client.infer("simple", past_end)
    assert raised.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert client.is_server_ready()
    client.unregister_system_shared_memory()
    assert client.get_system_shared_memory_status(as_json=True) == {}
