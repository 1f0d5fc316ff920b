"""Infer requests and responses between Triton's protobuf messages and the handlers' types.

A ``ModelInferRequest`` becomes the same :class:`~data_plane.protocol.InferRequest` an HTTP
body decodes to, and an :class:`~data_plane.handlers.infer.InferResponse` becomes a
``ModelInferResponse``, so the infer handler cannot tell the transports apart.

Input data comes, as in Triton, from the typed ``contents`` of a tensor or from
``raw_input_contents`` (one entry per input without ``contents``, in order; entries left
over are ignored); never from both in one request. Outputs always go out as
``raw_output_contents``, as Triton's gRPC front end sends them. An input or requested output
whose ``shared_memory_*`` parameters place it in a registered region carries that place
(`SharedMemoryRef`) for the infer handler to read or write; such an output goes out with an
empty ``raw_output_contents`` entry, as in Triton. Checks and texts follow
Triton's gRPC front end (``[request id: <id>]``-prefixed where Triton's core gives the
error); binary tensors go through the same decoder as HTTP's binary extension.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final, TypeVar

import numpy as np
import numpy.typing as npt
from google.protobuf.message import DecodeError, Message

from data_plane.errors import (
    InternalError,
    InvalidArgumentError,
    request_prefix,
)
from data_plane.handlers.infer import InferResponse
from data_plane.protocol import (
    REGION_PARAMETER,
    InferInput,
    InferRequest,
    RequestedOutput,
    SharedMemoryRef,
)
from data_plane.protocol.request import check_shape
from data_plane.protocol.response import bytes_elements, frame_bytes, wire_array
from data_plane.protocol.tensors import WIRE_DTYPES, bytes_array, decode_binary
from foundation.datatypes import NUMPY_DTYPES
from foundation.proto import grpc_service_pb2 as pb

_VERSION_RE: Final = re.compile(r"\s*[+-]?[0-9]+")
_INT64_MAX: Final = 2**63 - 1
_RESERVED_PREFIX: Final = "triton_"
_ALLOWED_RESERVED: Final = ("triton_enable_empty_final_response",)
_UINT64_MASK: Final = 2**64 - 1
_NO_DATA: Final = np.empty(0, dtype=np.uint8)
"""The data of an input in shared memory until the infer handler reads it."""
_NO_DATA.flags.writeable = False

# Typed contents, in the order Triton reads them, with the numpy type each carries.
_CONTENT_FIELDS: Final = (
    ("bool_contents", np.dtype(np.bool_)),
    ("int_contents", np.dtype(np.int32)),
    ("int64_contents", np.dtype(np.int64)),
    ("uint_contents", np.dtype(np.uint32)),
    ("uint64_contents", np.dtype(np.uint64)),
    ("fp32_contents", np.dtype(np.float32)),
    ("fp64_contents", np.dtype(np.float64)),
    ("bytes_contents", np.dtype(object)),
)
_FIELD_DATATYPES: Final = {
    "bool_contents": "BOOL",
    "int64_contents": "INT64",
    "uint64_contents": "UINT64",
    "fp32_contents": "FP32",
    "fp64_contents": "FP64",
    "bytes_contents": "BYTES",
}


_M = TypeVar("_M", bound=Message)


class UnparsableMessageError(InternalError):
    """A request message is not a valid protobuf encoding of its RPC's message (Triton
    answers INTERNAL, with this text)."""

    def __init__(self) -> None:
        super().__init__("Unable to parse request")


def parse(message_class: type[_M], data: bytes) -> _M:
    """``data`` as a ``message_class``; UnparsableMessageError when it is not one."""
    try:
        return message_class.FromString(data)
    except DecodeError:
        raise UnparsableMessageError() from None


def model_version(text: str) -> int | None:
    """A request's ``model_version`` as Triton reads it (C's ``stol``: leading blanks and
    a sign allowed, trailing characters ignored); None for empty (the latest version)."""
    if not text:
        return None
    match = _VERSION_RE.match(text)
    version = int(match.group()) if match else None
    if version is None or abs(version) > _INT64_MAX:
        raise InvalidArgumentError(
            f"failed to get model version from specified version string '{text}' "
            "(details: stol), version should be an integral value > 0"
        )
    if version < 0:
        raise InvalidArgumentError(
            f"invalid model version specified '{text}' , version should be an integral value > 0"
        )
    return version


def decode_infer_request(message: pb.ModelInferRequest, model: str) -> InferRequest:
    """The request ``message`` carries for ``model`` (the resolved model's name, for error
    texts); checks what the request alone shows, as the HTTP decoder does, and leaves the
    checks against the model's config to the infer handler."""
    request_id = message.id or None
    request = InferRequest(request_id, [], None, {}, False, 0, 0)
    if message.parameters:
        _parse_parameters(message.parameters, request)
    prefix = request_prefix(request_id)
    # Repeated fields are copied out once: each access to one costs a wrapper.
    tensors = message.inputs[:]
    names = [tensor.name for tensor in tensors]
    if len(set(names)) != len(names):
        twice = next(n for i, n in enumerate(names) if n in names[:i])
        raise InvalidArgumentError(f"{prefix}input '{twice}' already exists in request")
    raw = message.raw_input_contents[:]
    next_raw = 0
    for name, tensor in zip(names, tensors, strict=True):
        datatype = tensor.datatype
        shape = tuple(tensor.shape[:])
        place = _shared_memory(tensor.parameters, name) if tensor.parameters else None
        if place is not None:
            if tensor.HasField("contents"):
                raise InvalidArgumentError(
                    "unexpected 'content' provided when using shared memory for input tensor "
                    f"'{name}' for model '{model}'"
                )
            _check_shape(name, datatype, shape, prefix)
            request.uses_shared_memory = True
            request.inputs.append(InferInput(name, datatype, shape, _NO_DATA, place))
            continue
        if tensor.HasField("contents"):
            if raw:
                raise InvalidArgumentError(
                    "contents field must not be specified when using raw_input_contents for "
                    f"'{name}' for model '{model}'"
                )
            data = _typed_data(name, datatype, shape, tensor.contents, model, prefix)
        elif next_raw < len(raw):
            _check_shape(name, datatype, shape, prefix)
            data = decode_binary(name, datatype, shape, memoryview(raw[next_raw]), model, prefix)
            next_raw += 1
        else:
            raise InvalidArgumentError(
                f"unable to find data for input tensor '{name}' for model '{model}' in request."
            )
        request.inputs.append(InferInput(name, datatype, shape, data))
    if message.outputs:
        request.outputs = _requested_outputs(message.outputs)
        if any(o.shared_memory is not None for o in request.outputs):
            request.uses_shared_memory = True
    return request


def encode_infer_response(response: InferResponse) -> pb.ModelInferResponse:
    """``response`` as Triton's gRPC front end sends it: every output's data in
    ``raw_output_contents`` (BYTES framed with length prefixes), in output order."""
    outputs = []
    contents = []
    for output in response.outputs:
        data = output.data
        outputs.append(
            pb.ModelInferResponse.InferOutputTensor(
                name=output.name, datatype=output.datatype, shape=data.shape
            )
        )
        if output.shared_memory is not None:
            contents.append(b"")  # written to its region; Triton keeps the entry, empty
        elif output.datatype == "BYTES":
            contents.append(frame_bytes(bytes_elements(data)))
        else:
            contents.append(wire_array(output.datatype, data).tobytes())
    return pb.ModelInferResponse(
        model_name=response.model_name,
        model_version=response.model_version,
        id=response.id or "",
        outputs=outputs,
        raw_output_contents=contents,
    )


def _parse_parameters(parameters: Mapping[str, pb.InferParameter], request: InferRequest) -> None:
    values: dict[str, Any] = {}
    for key, parameter in parameters.items():
        choice = parameter.WhichOneof("parameter_choice")
        value = None if choice is None else getattr(parameter, choice)
        if key == "sequence_id":
            if choice not in ("int64_param", "string_param"):
                raise _wrong_type(key, "int64_param or string_param")
        elif key in ("sequence_start", "sequence_end"):
            if choice != "bool_param":
                raise _wrong_type(key, "bool_param")
        elif key == "priority":
            if choice not in ("int64_param", "uint64_param"):
                raise _wrong_type(key, "int64_param or uint64_param")
            priority = parameter.int64_param if choice == "int64_param" else parameter.uint64_param
            if priority < 0:
                raise InvalidArgumentError("invalid value for 'priority', expected value >= 0.")
            request.priority = priority
        elif key == "timeout":
            if choice != "int64_param":
                raise _wrong_type(key, "int64_param")
            # Triton takes the value as unsigned: a negative one is a timeout too far off
            # to matter, which is what 0 (no timeout) means here.
            request.timeout_us = max(parameter.int64_param, 0)
        elif key.startswith(_RESERVED_PREFIX):
            if key not in _ALLOWED_RESERVED:
                raise InvalidArgumentError(
                    "parameter keys starting with 'triton_' are reserved for Triton usage. "
                    "Only the following keys starting with 'triton_' are allowed: "
                    + " ".join(_ALLOWED_RESERVED)
                )
            if choice != "bool_param":
                raise _wrong_type(key, "bool_param")
        elif choice not in ("int64_param", "bool_param", "string_param", "double_param"):
            raise _wrong_type(key, "int64_param, bool_param, or string_param")
        values[key] = value
    request.parameters = values


def _wrong_type(key: str, expected: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"invalid value type for '{key}' parameter, expected {expected}.")


def _shared_memory(
    parameters: Mapping[str, pb.InferParameter], tensor: str
) -> SharedMemoryRef | None:
    """Where a tensor's parameters place it in shared memory (None: they do not), checked
    with Triton's gRPC texts. Offsets and sizes are int64 on the wire and unsigned to
    Triton: a negative one becomes a huge one, which the region's bounds then refuse."""
    region = parameters.get(REGION_PARAMETER)
    if region is not None and region.WhichOneof("parameter_choice") != "string_param":
        raise InvalidArgumentError(
            f"invalid value type for '{REGION_PARAMETER}' parameter for tensor '{tensor}', "
            "expected string_param."
        )
    place = [0, 0]
    for index, key in enumerate(("shared_memory_offset", "shared_memory_byte_size")):
        parameter = parameters.get(key)
        if parameter is None:
            continue
        if region is None:
            raise InvalidArgumentError(
                f"'{key}' can not be specified without '{REGION_PARAMETER}' parameter for "
                f"tensor '{tensor}'"
            )
        if parameter.WhichOneof("parameter_choice") != "int64_param":
            raise InvalidArgumentError(
                f"invalid value type for '{key}' parameter for tensor '{tensor}', expected "
                "int64_param."
            )
        place[index] = parameter.int64_param & _UINT64_MASK
    if region is None:
        return None
    if "shared_memory_byte_size" not in parameters:
        raise InvalidArgumentError(
            f"'shared_memory_byte_size' must be specified along with '{REGION_PARAMETER}' "
            f"parameter for tensor '{tensor}'"
        )
    return SharedMemoryRef(region.string_param, place[0], place[1])


def _field_datatype(field: str, datatype: str) -> str:
    """The datatype a typed-contents field carries: ``int_contents`` and ``uint_contents``
    also carry the narrower integers, one per 32-bit element."""
    if field == "int_contents":
        return datatype if datatype in ("INT8", "INT16") else "INT32"
    if field == "uint_contents":
        return datatype if datatype in ("UINT8", "UINT16") else "UINT32"
    return _FIELD_DATATYPES[field]


def _typed_data(
    name: str,
    datatype: str,
    shape: tuple[int, ...],
    contents: pb.InferTensorContents,
    model: str,
    prefix: str,
) -> npt.NDArray[Any]:
    shown = datatype if datatype in NUMPY_DTYPES else "<invalid>"
    values: Any = None
    carried: np.dtype[Any] = np.dtype(np.uint8)
    for field, field_dtype in _CONTENT_FIELDS:
        found = getattr(contents, field)
        if not found:
            continue
        if values is not None:
            raise InvalidArgumentError(
                f"unexpected explicit tensor data for input tensor '{name}' for model "
                f"'{model}', binary data was already supplied."
            )
        field_type = _field_datatype(field, datatype)
        if field_type != datatype:
            raise InvalidArgumentError(
                f"unexpected explicit tensor data for input tensor '{name}' for model "
                f"'{model}' of type '{field_type}', expected datatype '{shown}'"
            )
        values, carried = found, field_dtype
    _check_shape(name, datatype, shape, prefix)
    if datatype == "BYTES":
        elements = list(values) if values is not None else []
        return bytes_array(name, math.prod(shape), elements, model, prefix).reshape(shape)
    if values is None:
        chunk = b""
    else:
        # Narrower integers keep the low bytes of each 32-bit element, as in Triton.
        chunk = np.asarray(values, dtype=carried).astype(WIRE_DTYPES[datatype]).tobytes()
    return decode_binary(name, datatype, shape, memoryview(chunk), model, prefix)


def _check_shape(name: str, datatype: str, shape: tuple[int, ...], prefix: str) -> None:
    if datatype not in NUMPY_DTYPES:
        raise InvalidArgumentError(
            f"invalid datatype for input {name}: '{datatype}' is not a protocol datatype"
        )
    if any(dim < 0 for dim in shape):
        raise InvalidArgumentError(
            f"{prefix}unexpected shape for input '{name}': {list(shape)} has a negative dimension"
        )
    check_shape(name, datatype, shape, prefix)


def _requested_outputs(
    outputs: Iterable[pb.ModelInferRequest.InferRequestedOutputTensor],
) -> list[RequestedOutput]:
    requested: list[RequestedOutput] = []
    seen: set[str] = set()
    for output in outputs:
        place = _shared_memory(output.parameters, output.name) if output.parameters else None
        count = _classification(output.parameters)
        if place is not None and count:
            raise InvalidArgumentError(
                "output can't set both 'shared_memory_region' and 'classification'"
            )
        # Triton answers an output named twice once.
        if output.name not in seen:
            seen.add(output.name)
            requested.append(RequestedOutput(output.name, None, count, place))
    return requested


def _classification(parameters: Mapping[str, pb.InferParameter]) -> int:
    parameter = parameters.get("classification")
    if parameter is None:
        return 0
    if parameter.WhichOneof("parameter_choice") != "int64_param":
        raise InvalidArgumentError(
            "invalid value type for 'classification' parameter, expected int64_param"
        )
    if parameter.int64_param <= 0:
        # Triton's text, though 0 is refused too.
        raise InvalidArgumentError("invalid value for 'classification' parameter, expected >= 0")
    return parameter.int64_param
