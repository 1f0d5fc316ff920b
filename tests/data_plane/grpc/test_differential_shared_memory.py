"""System shared memory over gRPC, the same requests to real Triton 2.51 and to zeroserve:
registration, status, infer requests reading inputs from regions and writing outputs to
them, and the refusals for bad regions and places. Both servers map the same objects in
/dev/shm; the steps run in order, on one server each."""

from __future__ import annotations

import mmap
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from data_plane.settings import ModelControlMode
from foundation.proto import grpc_service_pb2 as pb
from tests.data_plane.grpc.differential import (
    Case,
    call,
    channel_to,
    check,
    write_twin_repositories,
)
from tests.data_plane.grpc.serving import serving
from tests.triton_oracle import triton_for

pytestmark = pytest.mark.integration

TENSOR_BYTES = 64  # one [1, 16] FP32 tensor
SUFFIX = uuid.uuid4().hex[:8]
KEYS = {name: f"/zs-grpc-diff-{name}-{SUFFIX}" for name in ("in", "out", "small", "spare")}
SIZES = {"in": 2 * TENSOR_BYTES, "out": 2 * TENSOR_BYTES, "small": 32, "spare": 32}
"""``spare`` is never registered; the registrations that must fail use it. Triton 2.51 reuses
the file descriptor of a key already registered, which it closed once the region was
mapped, so its bounds check on such a key fails or not as descriptors happen to be reused
(INTERNAL 'Invalid shared memory region' or INVALID_ARGUMENT 'invalid args'): zeroserve
always answers the latter."""
A = np.arange(16, dtype=np.float32)
B = np.full(16, 2.0, dtype=np.float32)


@pytest.fixture(scope="module")
def objects() -> Iterator[dict[str, Path]]:
    """The shared-memory objects: ``in`` holds A then B."""
    paths = {name: Path("/dev/shm") / key.lstrip("/") for name, key in KEYS.items()}
    try:
        for name, path in paths.items():
            path.write_bytes(bytes(SIZES[name]))
        paths["in"].write_bytes(A.tobytes() + B.tobytes())
        yield paths
    finally:
        for path in paths.values():
            path.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def channels(
    objects: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[grpc.Channel, grpc.Channel]]:
    zeroserve_repo = tmp_path_factory.mktemp("zeroserve-repo")
    triton_repo = tmp_path_factory.mktemp("triton-repo")
    write_twin_repositories(zeroserve_repo, triton_repo)
    with triton_for(triton_repo, tmp_path_factory.mktemp("triton-log")) as triton:
        with serving(
            zeroserve_repo, tmp_path_factory.mktemp("cache"), mode=ModelControlMode.NONE
        ) as zeroserve:
            with channel_to(triton.grpc_address) as t, channel_to(zeroserve.address) as z:
                yield t, z
                for channel in (t, z):
                    call(
                        channel,
                        "SystemSharedMemoryUnregister",
                        pb.SystemSharedMemoryUnregisterRequest(),
                        pb.SystemSharedMemoryUnregisterResponse,
                    )


def register(name: str, key: str, byte_size: int, offset: int = 0) -> Case:
    request = pb.SystemSharedMemoryRegisterRequest(
        name=name, key=key, offset=offset, byte_size=byte_size
    )
    return Case(
        f"register {name}",
        "SystemSharedMemoryRegister",
        request,
        pb.SystemSharedMemoryRegisterResponse,
    )


def placed(tensor: object, region: str, byte_size: int, offset: int = 0) -> None:
    parameters = tensor.parameters  # type: ignore[attr-defined]
    parameters["shared_memory_region"].string_param = region
    parameters["shared_memory_byte_size"].int64_param = byte_size
    parameters["shared_memory_offset"].int64_param = offset


def infer(
    label: str,
    *,
    sizes: tuple[int, int] = (TENSOR_BYTES, TENSOR_BYTES),
    offsets: tuple[int, int] = (0, TENSOR_BYTES),
    region: str = "in",
    outputs: str | None = None,
    output_size: int = TENSOR_BYTES,
    same_text: bool = True,
) -> Case:
    """add_sub with both inputs from ``region``, and its outputs to ``outputs`` if given."""
    request = pb.ModelInferRequest(model_name="add_sub", id=label)
    for name, size, offset in zip(("INPUT0", "INPUT1"), sizes, offsets, strict=True):
        placed(request.inputs.add(name=name, datatype="FP32", shape=[1, 16]), region, size, offset)
    if outputs is not None:
        for index, name in enumerate(("OUTPUT0", "OUTPUT1")):
            placed(request.outputs.add(name=name), outputs, output_size, index * TENSOR_BYTES)
    return Case(label, "ModelInfer", request, pb.ModelInferResponse, same_text)


def status(name: str = "") -> Case:
    return Case(
        f"status {name or 'of all'}",
        "SystemSharedMemoryStatus",
        pb.SystemSharedMemoryStatusRequest(name=name),
        pb.SystemSharedMemoryStatusResponse,
    )


def wrong_type() -> Case:
    case = infer("region of the wrong type")
    assert isinstance(case.request, pb.ModelInferRequest)
    case.request.inputs[0].parameters["shared_memory_region"].int64_param = 1
    return case


STEPS = [
    register("in", KEYS["in"], SIZES["in"]),
    register("out", KEYS["out"], SIZES["out"]),
    register("small", KEYS["small"], SIZES["small"]),
    Case(
        "register a name twice",
        "SystemSharedMemoryRegister",
        pb.SystemSharedMemoryRegisterRequest(name="in", key=KEYS["in"], byte_size=8),
        pb.SystemSharedMemoryRegisterResponse,
    ),
    register("missing", "/zs-grpc-diff-no-such-key", 8),
    register("too-large", KEYS["spare"], 64),
    register("offset-past-end", KEYS["spare"], 8, offset=64),
    status(),
    status("in"),
    status("nope"),
    infer("inputs from a region"),
    infer("inputs from and outputs to regions", outputs="out"),
    infer("unknown region", region="nope"),
    infer("offset past the region", offsets=(0, 2 * TENSOR_BYTES)),
    infer("input byte size not its shape's", sizes=(60, TENSOR_BYTES)),
    infer("output region too small", outputs="small", output_size=32),
    wrong_type(),
    Case(
        "unregister an unknown region",
        "SystemSharedMemoryUnregister",
        pb.SystemSharedMemoryUnregisterRequest(name="nope"),
        pb.SystemSharedMemoryUnregisterResponse,
    ),
    Case(
        "unregister one",
        "SystemSharedMemoryUnregister",
        pb.SystemSharedMemoryUnregisterRequest(name="small"),
        pb.SystemSharedMemoryUnregisterResponse,
    ),
    status(),
]


@pytest.mark.parametrize("case", STEPS, ids=str)
def test_same_answer_as_triton(
    case: Case, channels: tuple[grpc.Channel, grpc.Channel], objects: dict[str, Path]
) -> None:
    check(case, *channels)


def test_outputs_written_to_the_region(
    channels: tuple[grpc.Channel, grpc.Channel], objects: dict[str, Path]
) -> None:
    """Each server in turn writes add_sub's outputs to ``out``: the same bytes."""
    written = []
    for channel in channels:
        objects["out"].write_bytes(bytes(SIZES["out"]))
        case = infer("outputs written", outputs="out")
        outcome = call(channel, case.method, case.request, case.response_class)
        assert outcome.code == "OK", outcome
        with open(objects["out"], "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
            written.append(bytes(m))
    assert written[0] == written[1]
    assert np.frombuffer(written[1], np.float32).tolist() == list(A + B) + list(A - B)
    assert os.path.getsize(objects["out"]) == SIZES["out"]
