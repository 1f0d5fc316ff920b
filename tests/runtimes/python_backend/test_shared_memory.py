"""The arenas tensors cross in, the tensor codec, the message framing, and the contract
rule: everything the two sides share, without a stub process."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import numpy as np
import pytest

from foundation.proto import model_config_pb2 as mc
from runtimes.python_backend import contract, messages, tensors
from runtimes.python_backend.arena import ALIGNMENT, Arena, ArenaFullError


@pytest.fixture
def arena():
    created = Arena.create("test", size_bytes=4 * ALIGNMENT, limit_bytes=64 * ALIGNMENT)
    yield created
    created.close()


def test_blocks_are_aligned_reused_and_coalesced(arena: Arena):
    first = arena.allocate(10)
    second = arena.allocate(ALIGNMENT + 1)
    assert first == 0
    assert second == ALIGNMENT
    assert arena.used_bytes == 3 * ALIGNMENT
    arena.free(first)
    arena.free(second)
    arena.free(second)  # twice is harmless
    assert arena.used_bytes == 0
    assert arena.allocate(4 * ALIGNMENT) == 0  # the freed ranges joined up again


def test_arena_grows_in_place_and_a_reader_follows(arena: Arena):
    reader = Arena(os.dup(arena.fd), limit_bytes=0)
    try:
        kept = arena.allocate(ALIGNMENT)
        arena.view(kept, 3)[:] = b"abc"
        big = arena.allocate(10 * ALIGNMENT)
        assert arena.size_bytes >= 11 * ALIGNMENT
        arena.view(big, 5)[:] = b"hello"
        assert bytes(reader.view(kept, 3)) == b"abc"
        assert bytes(reader.view(big, 5)) == b"hello"
        with pytest.raises(ValueError, match="outside the shared memory"):
            reader.view(arena.size_bytes, 1)
    finally:
        reader.close()


def test_arena_refuses_past_its_bound(arena: Arena):
    with pytest.raises(ArenaFullError, match="more than the 4096 bytes"):
        arena.allocate(65 * ALIGNMENT)
    assert arena.allocate(60 * ALIGNMENT) >= 0


@pytest.mark.parametrize("datatype", sorted(set(tensors.DTYPES) - {"BYTES"}))
def test_numeric_tensors_round_trip(arena: Arena, datatype: str):
    array = (np.arange(12) % 2).astype(tensors.DTYPES[datatype]).reshape(3, 4)
    descriptor = tensors.write(arena, "T", array)
    assert descriptor["datatype"] == datatype
    assert descriptor["shape"] == [3, 4]
    back = tensors.read(arena, descriptor)
    np.testing.assert_array_equal(back, array)
    assert back.dtype == array.dtype
    assert not np.shares_memory(back, np.frombuffer(arena.view(0, 1), np.uint8))


def test_bytes_tensor_round_trip_and_empty_tensor(arena: Arena):
    array = np.array([[b"a", "b\u00fc"], [b"", b"xyz"]], dtype=np.object_)
    back = tensors.read(arena, tensors.write(arena, "S", array))
    assert back.tolist() == [[b"a", "b\u00fc".encode()], [b"", b"xyz"]]
    empty = tensors.read(arena, tensors.write(arena, "E", np.zeros((0, 3), np.float32)))
    assert empty.shape == (0, 3)


@pytest.mark.parametrize(
    ("dtype", "rows"),
    [
        pytest.param(">i4", 3, id="big-endian"),
        pytest.param("<i4", 3, id="small"),
        # Past the size up to which a tensor is copied in through its bytes.
        pytest.param("<i4", 20_000, id="large"),
    ],
)
def test_non_contiguous_and_big_endian_arrays_are_written_in_order(dtype: str, rows: int):
    array = np.arange(rows * 4, dtype=dtype).reshape(rows, 4)[:, ::2]
    arena = Arena.create("test", size_bytes=ALIGNMENT, limit_bytes=2 * array.nbytes)
    try:
        back = tensors.read(arena, tensors.write(arena, "T", array))
    finally:
        arena.close()
    np.testing.assert_array_equal(back, array)
    assert back.dtype.isnative


@pytest.mark.parametrize(
    "descriptor",
    [
        pytest.param({"datatype": "FP32", "shape": [3], "offset": 0, "nbytes": 8}, id="size"),
        pytest.param({"datatype": "COMPLEX", "shape": [1], "offset": 0, "nbytes": 8}, id="dtype"),
        pytest.param({"datatype": "BYTES", "shape": [2], "offset": 0, "nbytes": 4}, id="bytes"),
    ],
)
def test_malformed_descriptors_are_refused(arena: Arena, descriptor: dict[str, object]):
    arena.allocate(ALIGNMENT)
    arena.view(0, 4)[:] = b"\x00\x00\x00\x00"
    with pytest.raises(ValueError):
        tensors.read(arena, descriptor)


def test_messages_frame_over_a_socket():
    left, right = socket.socketpair()
    with left, right:
        messages.send(left, {"kind": "log", "message": "\u00fc" * 3})
        assert messages.receive(right) == {"kind": "log", "message": "\u00fc" * 3}
        left.sendall(messages.HEADER.pack(5) + b"[1,2]")
        with pytest.raises(ValueError, match="'kind'"):
            messages.receive(right)
        left.close()
        with pytest.raises(messages.ChannelClosedError):
            messages.receive(right)


def test_oversized_frame_is_refused():
    with pytest.raises(ValueError, match="exceeds"):
        messages.body_length(messages.HEADER.pack(messages.MAX_MESSAGE_BYTES + 1))


@pytest.mark.parametrize(
    ("source", "parameters", "is_triton"),
    [
        pytest.param(
            "import triton_python_backend_utils as pb_utils\nclass TritonPythonModel: pass\n",
            {},
            True,
            id="imports-pb-utils",
        ),
        pytest.param(
            "from triton_python_backend_utils import Tensor\n", {}, True, id="from-import"
        ),
        pytest.param(
            "class TritonPythonModel:\n    def execute(self, requests):\n        return []\n",
            {},
            True,
            id="execute-requests",
        ),
        pytest.param(
            "class TritonPythonModel:\n    def execute(self, inputs):\n        return inputs\n",
            {},
            False,
            id="dict-contract",
        ),
        pytest.param(
            "class TritonPythonModel:\n    def execute(self, inputs):\n        return inputs\n",
            {"EXECUTION_ENV_PATH": "/env"},
            True,
            id="execution-env",
        ),
        pytest.param("def broken(:\n", {}, True, id="syntax-error"),
        pytest.param("import numpy\n", {}, False, id="no-class"),
    ],
)
def test_contract_rule(tmp_path: Path, source: str, parameters: dict[str, str], is_triton: bool):
    path = tmp_path / "model.py"
    path.write_text(source)
    config = mc.ModelConfig()
    for key, value in parameters.items():
        config.parameters[key].string_value = value
    assert contract.follows_triton_contract(path, config) is is_triton


def test_auto_complete_is_found_in_the_class_only(tmp_path: Path):
    path = tmp_path / "model.py"
    path.write_text(
        "class TritonPythonModel:\n    @staticmethod\n    def auto_complete_config(c):\n"
        "        return c\n"
    )
    assert contract.defines_auto_complete(path)
    path.write_text("def auto_complete_config(c):\n    return c\n")
    assert not contract.defines_auto_complete(path)
