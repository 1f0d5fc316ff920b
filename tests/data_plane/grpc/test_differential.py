"""The same gRPC requests, good and bad, to real Triton 2.51 and to zeroserve: the same
status codes, the same texts where zeroserve's are Triton's, the same answers. Skips, saying
why, where Triton's wheel cannot be installed or run."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from google.protobuf.message import Message

from data_plane.settings import ModelControlMode
from foundation.proto import grpc_service_pb2 as pb
from tests.data_plane.grpc.differential import (
    Case,
    channel_to,
    check,
    stream,
    write_twin_repositories,
)
from tests.data_plane.grpc.serving import serving
from tests.triton_oracle import triton_for

pytestmark = pytest.mark.integration

Request = pb.ModelInferRequest
F16 = [float(i) for i in range(16)]


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    zeroserve_repo = tmp_path_factory.mktemp("zeroserve-repo")
    triton_repo = tmp_path_factory.mktemp("triton-repo")
    write_twin_repositories(zeroserve_repo, triton_repo)
    return zeroserve_repo, triton_repo


@pytest.fixture(scope="module")
def triton(
    repos: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[grpc.Channel]:
    with triton_for(repos[1], tmp_path_factory.mktemp("triton-log")) as server:
        with channel_to(server.grpc_address) as channel:
            yield channel


@pytest.fixture(scope="module")
def zeroserve(
    repos: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[grpc.Channel]:
    cache = tmp_path_factory.mktemp("cache")
    with serving(repos[0], cache, mode=ModelControlMode.NONE) as running:
        with channel_to(running.address) as channel:
            yield channel


def add_sub(*, raw: bool = False, **fields: object) -> Request:
    """A good add_sub request (typed contents, or raw ones), with ``fields`` set."""
    request = Request(model_name="add_sub")
    for name in ("INPUT0", "INPUT1"):
        tensor = request.inputs.add(name=name, datatype="FP32", shape=[1, 16])
        if raw:
            request.raw_input_contents.append(np.array(F16, dtype=np.float32).tobytes())
        else:
            tensor.contents.fp32_contents.extend(F16)
    for key, value in fields.items():
        setattr(request, key, value)
    return request


def changed(change: Callable[[Request], object], *, raw: bool = False) -> Request:
    """A good add_sub request after ``change``."""
    request = add_sub(raw=raw)
    change(request)
    return request


def identity(datatype: str, shape: list[int], field: str | None, values: list[object]) -> Request:
    """An identity request: ``values`` in a typed-contents ``field``, or as the bytes of
    the raw contents when ``field`` is None."""
    request = Request(model_name=f"identity_{datatype.lower()}")
    tensor = request.inputs.add(name="INPUT0", datatype=datatype, shape=shape)
    if field is None:
        request.raw_input_contents.append(bytes(values))  # type: ignore[arg-type]
    else:
        getattr(tensor.contents, field).extend(values)
    return request


def param(parameters: object, key: str, choice: str, value: object) -> None:
    setattr(parameters[key], choice, value)  # type: ignore[index]


def output(request: Request, name: str, **parameters: tuple[str, object]) -> None:
    requested = request.outputs.add(name=name)
    for key, (choice, value) in parameters.items():
        param(requested.parameters, key, choice, value)


def set_shape(index: int, dim: int, value: int) -> Callable[[Request], None]:
    return lambda r: r.inputs[index].shape.__setitem__(dim, value)


def set_datatype(datatype: str) -> Callable[[Request], None]:
    return lambda r: setattr(r.inputs[0], "datatype", datatype)


def int32_contents(request: Request) -> None:
    request.inputs[0].datatype = "INT32"
    request.inputs[0].ClearField("contents")
    request.inputs[0].contents.int_contents.extend(range(16))


def extra_input(request: Request) -> None:
    request.inputs.add(name="INPUT2", datatype="FP32", shape=[1, 16]).contents.fp32_contents.extend(
        F16
    )


def batch_of_nine(request: Request) -> None:
    for tensor in request.inputs:
        tensor.shape[0] = 9
        tensor.contents.fp32_contents.extend(F16 * 8)


def output_twice(request: Request) -> None:
    output(request, "OUTPUT0")
    output(request, "OUTPUT0")


def int8_in_two_fields() -> Request:
    request = identity("INT8", [1, 1], "int_contents", [1])
    request.inputs[0].contents.int64_contents.append(1)
    return request


def same_metadata_but_platform(expected: Message, actual: Message) -> None:
    # The platform names the backend: python for Triton's twin, onnxruntime for ours.
    assert isinstance(expected, pb.ModelMetadataResponse)
    assert isinstance(actual, pb.ModelMetadataResponse)
    expected.platform = actual.platform = ""
    assert actual == expected


def trace(model: str = "", **settings: list[str]) -> pb.TraceSettingRequest:
    request = pb.TraceSettingRequest(model_name=model)
    for name, values in settings.items():
        request.settings[name].value.extend(values)
    return request


def log(**settings: tuple[str, object]) -> pb.LogSettingsRequest:
    # Only settings that are refused: one taken would change this process's logging.
    request = pb.LogSettingsRequest()
    for name, (choice, value) in settings.items():
        setattr(request.settings[name], choice, value)
    return request


def same_log_names(expected: Message, actual: Message) -> None:
    # The values are each process's own logging (pytest's, here); the names and types are
    # the protocol's.
    assert isinstance(expected, pb.LogSettingsResponse)
    assert isinstance(actual, pb.LogSettingsResponse)
    kinds = [
        {name: value.WhichOneof("parameter_choice") for name, value in r.settings.items()}
        for r in (expected, actual)
    ]
    assert kinds[1] == kinds[0]


def infer(label: str, request: Message | bytes, *, same_text: bool = True) -> Case:
    return Case(label, "ModelInfer", request, pb.ModelInferResponse, same_text)


def rpc(label: str, method: str, request: Message, **options: object) -> Case:
    response_class = getattr(pb, method + "Response", pb.ServerLiveResponse)
    return Case(label, method, request, response_class, **options)  # type: ignore[arg-type]


CASES = [
    infer("typed contents", add_sub()),
    infer("raw contents", add_sub(raw=True)),
    infer("request id echoed", add_sub(id="abc")),
    infer("unknown model", add_sub(model_name="nope")),
    infer("empty model name", add_sub(model_name="")),
    infer("version 1", add_sub(model_version="1")),
    infer("version read as stol", add_sub(model_version=" 1x")),
    infer("version not a number", add_sub(model_version="abc")),
    infer("negative version", add_sub(model_version="-1")),
    infer("version out of range", add_sub(model_version="99999999999999999999")),
    infer("version not found", add_sub(model_version="7")),
    infer("version 0", add_sub(model_version="0")),
    # Triton checks the model's shape first; zeroserve, as over HTTP, first checks the data's
    # size against the request's shape (16 values for [1, 15]). Its shape text also ends as
    # later Triton's ("...for allowed inference request shapes."), not 2.51's.
    infer("bad shape", changed(set_shape(0, 1, 15)), same_text=False),
    infer("negative dimension", changed(set_shape(0, 1, -16), raw=True), same_text=False),
    infer("typed contents of another type", changed(set_datatype("INT32"))),
    infer("unknown datatype", changed(set_datatype("FOO"))),
    infer("datatype not the model's", changed(int32_contents)),
    infer("missing input", changed(lambda r: r.inputs.pop())),
    # Triton 2.51 counts the inputs; zeroserve names the unexpected one, as HTTP does.
    infer("unexpected input", changed(extra_input), same_text=False),
    infer("duplicate input", changed(lambda r: setattr(r.inputs[1], "name", "INPUT0"))),
    infer("empty contents", changed(lambda r: r.inputs[1].contents.Clear())),
    infer("too few elements", changed(lambda r: r.inputs[1].contents.fp32_contents.pop())),
    infer("contents and raw contents", changed(lambda r: r.raw_input_contents.append(b"\0" * 64))),
    infer(
        "raw contents for one input of two", changed(lambda r: r.raw_input_contents.pop(), raw=True)
    ),
    infer(
        "raw contents of the wrong size",
        changed(lambda r: r.raw_input_contents.__setitem__(0, b"\0" * 60), raw=True),
    ),
    infer(
        "raw contents left over",
        changed(lambda r: r.raw_input_contents.append(b"\0" * 64), raw=True),
    ),
    infer("batch too large", changed(batch_of_nine)),
    # Triton 2.51 has no request id prefix here; zeroserve's core adds one, as for HTTP.
    infer("unknown output", changed(lambda r: output(r, "NOPE")), same_text=False),
    infer("output named twice", changed(output_twice)),
    infer("one output of two", changed(lambda r: output(r, "OUTPUT1"))),
    infer(
        "classification", changed(lambda r: output(r, "OUTPUT0", classification=("int64_param", 2)))
    ),
    infer(
        "classification 0",
        changed(lambda r: output(r, "OUTPUT0", classification=("int64_param", 0))),
    ),
    infer(
        "classification as text",
        changed(lambda r: output(r, "OUTPUT0", classification=("string_param", "2"))),
    ),
    infer(
        "binary_data ignored",
        changed(lambda r: output(r, "OUTPUT0", binary_data=("bool_param", True))),
    ),
    infer(
        "priority as text", changed(lambda r: param(r.parameters, "priority", "string_param", "x"))
    ),
    infer(
        "negative priority", changed(lambda r: param(r.parameters, "priority", "int64_param", -1))
    ),
    infer(
        "unsigned priority", changed(lambda r: param(r.parameters, "priority", "uint64_param", 5))
    ),
    infer("timeout as bool", changed(lambda r: param(r.parameters, "timeout", "bool_param", True))),
    infer("negative timeout", changed(lambda r: param(r.parameters, "timeout", "int64_param", -5))),
    infer(
        "sequence_id as bool",
        changed(lambda r: param(r.parameters, "sequence_id", "bool_param", True)),
    ),
    infer(
        "reserved parameter", changed(lambda r: param(r.parameters, "triton_x", "bool_param", True))
    ),
    infer(
        "allowed reserved parameter",
        changed(
            lambda r: param(r.parameters, "triton_enable_empty_final_response", "bool_param", True)
        ),
    ),
    infer(
        "allowed reserved parameter as int",
        changed(
            lambda r: param(r.parameters, "triton_enable_empty_final_response", "int64_param", 1)
        ),
    ),
    infer(
        "parameter with no value",
        changed(lambda r: r.parameters["foo"].CopyFrom(pb.InferParameter())),
    ),
    infer(
        "custom double parameter",
        changed(lambda r: param(r.parameters, "foo", "double_param", 1.5)),
    ),
    infer(
        "custom unsigned parameter",
        changed(lambda r: param(r.parameters, "foo", "uint64_param", 5)),
    ),
    infer(
        "shared memory without byte size",
        changed(
            lambda r: param(r.inputs[0].parameters, "shared_memory_region", "string_param", "x")
        ),
    ),
    infer(
        "output shared memory without byte size",
        changed(lambda r: output(r, "OUTPUT0", shared_memory_region=("string_param", "x"))),
    ),
    infer("malformed protobuf", b"\xff\xff\xff"),
    infer("bytes", identity("BYTES", [1, 2], "bytes_contents", [b"a", b"bc"])),
    infer("bytes, too few", identity("BYTES", [1, 2], "bytes_contents", [b"a"])),
    infer("bytes, too many", identity("BYTES", [1, 2], "bytes_contents", [b"a", b"b", b"c"])),
    infer("raw bytes, short length prefix", identity("BYTES", [1, 1], None, [1, 0])),
    # Triton 2.51 leaves out the prefix and the model name here; the code is the same.
    infer(
        "raw bytes, truncated",
        identity("BYTES", [1, 2], None, [1, 0, 0, 0, 97, 5, 0, 0, 0, 98]),
        same_text=False,
    ),
    infer("int8 from int_contents", identity("INT8", [1, 3], "int_contents", [1, 100, -2])),
    infer("int8 from two fields", int8_in_two_fields()),
    infer("uint16 from uint_contents", identity("UINT16", [1, 2], "uint_contents", [7, 5])),
    infer("fp16 from fp32_contents", identity("FP16", [1, 3], "fp32_contents", [1.0, 3.0, -2.0])),
    infer(
        "fp16 raw", identity("FP16", [1, 3], None, list(np.array([1, 2, 3], np.float16).tobytes()))
    ),
    infer("bool contents", identity("BOOL", [1, 3], "bool_contents", [True, False, True])),
    infer("zero elements", identity("FP32", [1, 0], None, [])),
    infer("shape too large for its data", identity("FP32", [1, 2**40], None, [])),
    # Triton counts 71 dimensions as a shape mismatch; zeroserve refuses more than numpy
    # holds, with the same code.
    infer("71 dimensions", identity("FP32", [1] * 71, None, [0, 0, 0, 0]), same_text=False),
    rpc("ready", "ModelReady", pb.ModelReadyRequest(name="add_sub")),
    rpc("ready, unknown model", "ModelReady", pb.ModelReadyRequest(name="nope")),
    rpc(
        "ready, version not a number",
        "ModelReady",
        pb.ModelReadyRequest(name="add_sub", version="x"),
    ),
    rpc("ready, missing version", "ModelReady", pb.ModelReadyRequest(name="add_sub", version="3")),
    rpc("server live", "ServerLive", pb.ServerLiveRequest()),
    rpc("server ready", "ServerReady", pb.ServerReadyRequest()),
    rpc(
        "metadata",
        "ModelMetadata",
        pb.ModelMetadataRequest(name="add_sub"),
        compare=same_metadata_but_platform,
    ),
    rpc(
        "metadata, bytes",
        "ModelMetadata",
        pb.ModelMetadataRequest(name="identity_bytes", version="1"),
        compare=same_metadata_but_platform,
    ),
    rpc("metadata, unknown model", "ModelMetadata", pb.ModelMetadataRequest(name="nope")),
    rpc(
        "metadata, version not a number",
        "ModelMetadata",
        pb.ModelMetadataRequest(name="add_sub", version="x"),
    ),
    rpc(
        "metadata, missing version",
        "ModelMetadata",
        pb.ModelMetadataRequest(name="add_sub", version="3"),
    ),
    rpc("config, unknown model", "ModelConfig", pb.ModelConfigRequest(name="nope")),
    rpc(
        "config, missing version", "ModelConfig", pb.ModelConfigRequest(name="add_sub", version="3")
    ),
    rpc("statistics, unknown model", "ModelStatistics", pb.ModelStatisticsRequest(name="nope")),
    rpc(
        "statistics, missing version",
        "ModelStatistics",
        pb.ModelStatisticsRequest(name="add_sub", version="3"),
    ),
    rpc(
        "statistics, version not a number",
        "ModelStatistics",
        pb.ModelStatisticsRequest(name="add_sub", version="x"),
    ),
    rpc(
        "index of a named repository",
        "RepositoryIndex",
        pb.RepositoryIndexRequest(repository_name="x"),
    ),
    rpc(
        "load outside explicit mode",
        "RepositoryModelLoad",
        pb.RepositoryModelLoadRequest(model_name="add_sub"),
    ),
    rpc(
        "unload outside explicit mode",
        "RepositoryModelUnload",
        pb.RepositoryModelUnloadRequest(model_name="add_sub"),
    ),
    rpc("cuda shared memory status", "CudaSharedMemoryStatus", pb.CudaSharedMemoryStatusRequest()),
    rpc(
        "cuda shared memory status, unknown region",
        "CudaSharedMemoryStatus",
        pb.CudaSharedMemoryStatusRequest(name="x"),
    ),
    rpc(
        "cuda shared memory unregister",
        "CudaSharedMemoryUnregister",
        pb.CudaSharedMemoryUnregisterRequest(name="x"),
    ),
    # Triton's wheel has CUDA and fails on the handle; zeroserve has none and adds why.
    rpc(
        "cuda shared memory register",
        "CudaSharedMemoryRegister",
        pb.CudaSharedMemoryRegisterRequest(name="x", raw_handle=b"abc", byte_size=10),
        same_text=False,
    ),
    rpc("trace setting", "TraceSetting", pb.TraceSettingRequest()),
    rpc("trace setting of a model", "TraceSetting", pb.TraceSettingRequest(model_name="add_sub")),
    rpc(
        "trace setting of an unknown model",
        "TraceSetting",
        pb.TraceSettingRequest(model_name="nope"),
    ),
    rpc("trace setting, unknown name ignored", "TraceSetting", trace(bogus=["1"])),
    rpc("trace setting, trace_file", "TraceSetting", trace(trace_file=["/tmp/x"])),
    rpc("trace setting, rate not a number", "TraceSetting", trace(trace_rate=["abc"])),
    rpc("trace setting, rate out of range", "TraceSetting", trace(trace_rate=["99999999999"])),
    rpc("trace setting, two rates", "TraceSetting", trace(trace_rate=["1", "2"])),
    rpc("trace setting, count below -1", "TraceSetting", trace(trace_count=["-5"])),
    rpc(
        "trace setting, OFF among levels", "TraceSetting", trace(trace_level=["OFF", "TIMESTAMPS"])
    ),
    rpc(
        "trace setting, a level without a trace file",
        "TraceSetting",
        trace(trace_level=["TIMESTAMPS"]),
    ),
    rpc("trace setting of a model, rate", "TraceSetting", trace("add_sub", trace_rate=["5"])),
    rpc("trace setting of a model, cleared", "TraceSetting", trace("add_sub", trace_rate=[])),
    rpc("log settings", "LogSettings", pb.LogSettingsRequest(), compare=same_log_names),
    rpc("log settings, log_file", "LogSettings", log(log_file=("string_param", "/tmp/x"))),
    rpc("log settings, log_info not a bool", "LogSettings", log(log_info=("string_param", "x"))),
    rpc(
        "log settings, verbose level not an int",
        "LogSettings",
        log(log_verbose_level=("bool_param", True)),
    ),
    rpc("log settings, format not a string", "LogSettings", log(log_format=("bool_param", True))),
    rpc("log settings, unknown format", "LogSettings", log(log_format=("string_param", "xml"))),
    # The text is the gRPC library's: none from Triton's C++, "Method not found!" from Python.
    rpc("unknown method", "NoSuchMethod", pb.ServerLiveRequest(), same_text=False),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_same_answer_as_triton(case: Case, triton: grpc.Channel, zeroserve: grpc.Channel) -> None:
    check(case, triton, zeroserve)


def test_stream_same_as_triton(triton: grpc.Channel, zeroserve: grpc.Channel) -> None:
    short = changed(lambda r: r.inputs[1].contents.fp32_contents.pop())
    short.id = "short"
    requests = [
        add_sub(id="good", raw=True),
        add_sub(id="unknown", model_name="nope"),
        short,
        add_sub(id="also good"),
    ]
    expected = {r.infer_response.id: r for r in stream(triton, requests)}
    actual = {r.infer_response.id: r for r in stream(zeroserve, requests)}
    assert sorted(actual) == sorted(expected)
    assert actual["good"] == expected["good"]
    assert actual["also good"] == expected["also good"]
    assert actual["unknown"] == expected["unknown"]
    assert actual["short"].error_message == expected["short"].error_message
    assert actual["short"].infer_response == expected["short"].infer_response
