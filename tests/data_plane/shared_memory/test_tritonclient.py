"""``tritonclient.http`` with ``tritonclient.utils.shared_memory``, unchanged, against a real
``zeroserve serve`` process: the client repository's ``simple_http_shm_client`` and
``simple_http_shm_string_client`` flows, and the client's errors for bad regions with the
server serving on after each."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

tritonhttp = pytest.importorskip("tritonclient.http")
shm = pytest.importorskip("tritonclient.utils.shared_memory")
from tritonclient.utils import (  # noqa: E402
    InferenceServerException,
    serialize_byte_tensor,
    serialized_byte_size,
)

from tests.integration.conftest import ServerProcess, start_server  # noqa: E402
from tests.models import write_onnx_add_sub, write_onnx_identity  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    write_onnx_add_sub(repo, "simple", dtype="INT32", dims=(16,), max_batch_size=8)
    write_onnx_identity(repo, "strings", datatype="BYTES", dims=(-1,), max_batch_size=8)
    process = start_server(repo, tmp_path_factory.mktemp("logs"))
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Any]:
    c = tritonhttp.InferenceServerClient(server.address)
    try:
        yield c
    finally:
        c.unregister_system_shared_memory()
        c.close()


@pytest.fixture
def regions() -> Iterator[dict[str, object]]:
    """Client-made regions by name, destroyed after the test (``create`` adds one)."""
    made: dict[str, object] = {}
    try:
        yield made
    finally:
        for handle in made.values():
            shm.destroy_shared_memory_region(handle)


def create(regions: dict[str, object], name: str, byte_size: int) -> tuple[object, str]:
    key = f"/zs-test-{name}-{uuid.uuid4().hex[:8]}"
    regions[name] = shm.create_shared_memory_region(name, key, byte_size)
    return regions[name], key


def test_simple_http_shm_client(client: Any, regions) -> None:
    input0 = np.arange(16, dtype=np.int32).reshape(1, 16)
    input1 = np.ones((1, 16), dtype=np.int32)
    size = input0.nbytes
    output_handle, output_key = create(regions, "output_data", size * 2)
    client.register_system_shared_memory("output_data", output_key, size * 2)
    input_handle, input_key = create(regions, "input_data", size * 2)
    shm.set_shared_memory_region(input_handle, [input0])
    shm.set_shared_memory_region(input_handle, [input1], offset=size)
    client.register_system_shared_memory("input_data", input_key, size * 2)

    inputs = [
        tritonhttp.InferInput("INPUT0", [1, 16], "INT32"),
        tritonhttp.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_shared_memory("input_data", size)
    inputs[1].set_shared_memory("input_data", size, offset=size)
    outputs = [
        tritonhttp.InferRequestedOutput("OUTPUT0", binary_data=True),
        tritonhttp.InferRequestedOutput("OUTPUT1", binary_data=True),
    ]
    outputs[0].set_shared_memory("output_data", size)
    outputs[1].set_shared_memory("output_data", size, offset=size)
    result = client.infer(model_name="simple", inputs=inputs, outputs=outputs)

    output0 = result.get_output("OUTPUT0")
    output1 = result.get_output("OUTPUT1")
    assert "data" not in output0 and "parameters" not in output0  # the data is in the region
    sums = shm.get_contents_as_numpy(output_handle, np.int32, output0["shape"])
    differences = shm.get_contents_as_numpy(output_handle, np.int32, output1["shape"], offset=size)
    assert np.array_equal(sums, input0 + input1)
    assert np.array_equal(differences, input0 - input1)
    status = client.get_system_shared_memory_status()
    assert sorted((r["name"], r["key"], r["byte_size"]) for r in status) == [
        ("input_data", input_key, size * 2),
        ("output_data", output_key, size * 2),
    ]
    client.unregister_system_shared_memory()
    assert client.get_system_shared_memory_status() == []


def test_simple_http_shm_string_client(client: Any, regions) -> None:
    values = np.array([[b"shared", b"", "memory \u2713".encode()]], dtype=np.object_)
    serialized = serialize_byte_tensor(values)
    size = serialized_byte_size(serialized)
    input_handle, input_key = create(regions, "string_in", size)
    shm.set_shared_memory_region(input_handle, [serialized])
    client.register_system_shared_memory("string_in", input_key, size)
    output_handle, output_key = create(regions, "string_out", 256)
    client.register_system_shared_memory("string_out", output_key, 256)

    tensor = tritonhttp.InferInput("INPUT0", [1, 3], "BYTES")
    tensor.set_shared_memory("string_in", size)
    wanted = tritonhttp.InferRequestedOutput("OUTPUT0", binary_data=True)
    wanted.set_shared_memory("string_out", 256)
    result = client.infer(model_name="strings", inputs=[tensor], outputs=[wanted])
    output = result.get_output("OUTPUT0")
    assert output["datatype"] == "BYTES"
    back = shm.get_contents_as_numpy(output_handle, np.object_, output["shape"])
    assert back.tolist() == values.tolist()


def test_errors_the_client_sees(client: Any, regions) -> None:
    def refused(call) -> tuple[str | None, str]:
        with pytest.raises(InferenceServerException) as info:
            call()
        return info.value.status(), info.value.message()

    assert refused(lambda: client.get_system_shared_memory_status("nope")) == (
        "404",
        "Unable to find system shared memory region: 'nope'",
    )
    assert refused(lambda: client.register_system_shared_memory("x", "/zs-no-such-key", 8)) == (
        "500",
        "Unable to open shared memory region: '/zs-no-such-key'",
    )
    assert (
        refused(lambda: client.register_system_shared_memory("x", "/../etc/passwd", 8))[0] == "500"
    )
    handle, key = create(regions, "small", 32)
    client.register_system_shared_memory("small", key, 32)
    assert refused(lambda: client.register_system_shared_memory("small", key, 32)) == (
        "400",
        "shared memory region 'small' already in manager",
    )
    assert refused(lambda: client.register_system_shared_memory("big", key, 64)) == (
        "400",
        "failed to register shared memory region 'big': invalid args",
    )

    data = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [
        tritonhttp.InferInput("INPUT0", [1, 16], "INT32"),
        tritonhttp.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    for tensor in inputs:
        tensor.set_data_from_numpy(data)
    too_small = tritonhttp.InferRequestedOutput("OUTPUT0")
    too_small.set_shared_memory("small", 32)
    assert refused(lambda: client.infer("simple", inputs, outputs=[too_small])) == (
        "500",
        "shared memory size specified with the request for output 'OUTPUT0' (32 bytes) should "
        "be at least 64 bytes to hold the results",
    )
    past_end = tritonhttp.InferInput("INPUT0", [1, 16], "INT32")
    past_end.set_shared_memory("small", 64, offset=16)
    assert refused(lambda: client.infer("simple", [past_end, inputs[1]])) == (
        "400",
        "Invalid offset + byte size for shared memory region: 'small'",
    )
    unknown = tritonhttp.InferInput("INPUT0", [1, 16], "INT32")
    unknown.set_shared_memory("gone", 64)
    assert refused(lambda: client.infer("simple", [unknown, inputs[1]])) == (
        "404",
        "Unable to find shared memory region: 'gone'",
    )
    assert refused(lambda: client.register_cuda_shared_memory("cuda", b"A" * 88, 0, 8))[0] == "400"
    assert client.get_cuda_shared_memory_status() == []

    # Still serving.
    result = client.infer("simple", inputs)
    assert np.array_equal(result.as_numpy("OUTPUT0"), 2 * data)
    assert client.is_server_ready()
