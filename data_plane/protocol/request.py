"""Decoding infer requests: the request types, the JSON header and its inputs and outputs.

Owns `InferRequest` and its parts, the ``Inference-Header-Content-Length`` header, the walk over
the request JSON in Triton's order of checks (parameters, inputs, outputs) and the mapping of a
raw binary request onto the model's only input. Tensor data is decoded by `json_data` (JSON
``data`` arrays) and `tensors` (binary data).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import orjson

from data_plane.errors import InvalidArgumentError, request_prefix
from data_plane.protocol.json_data import (
    LIMIT_HINT,
    NOT_ARRAY,
    NOT_BOOL,
    NOT_STRING,
    NOT_UINT,
    decode_json_data,
)
from data_plane.protocol.shared_memory import REGION_PARAMETER, SharedMemoryRef, shared_memory_ref
from data_plane.protocol.tensors import decode_binary
from foundation.datatypes import ELEMENT_BYTES, NUMPY_DTYPES

DEFAULT_MAX_INPUT_BYTES: Final = 64 * 2**20
"""Triton's ``--http-max-input-size`` default."""
RAW_INPUT_NAME: Final = "raw_input"
"""Name of the single input of a raw binary request (``Inference-Header-Content-Length: 0``)."""

_HEADER: Final = "Inference-Header-Content-Length"
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_INTEGER_RE: Final = re.compile(r"\s*[+-]?[0-9]+\s*")
_MAX_DIMS: Final = 64  # numpy's NPY_MAXDIMS
_MAX_SIZE: Final = 2**63 - 1  # the protocol's dims are int64, numpy's sizes too
_NO_DATA: Final = np.empty(0, dtype=np.uint8)
_NO_DATA.flags.writeable = False


@dataclass(slots=True)
class InferInput:
    """One decoded input tensor.

    ``data`` has shape ``shape`` and dtype ``NUMPY_DTYPES[datatype]``. Binary numeric inputs are
    zero-copy views of the request body and therefore read-only; copy before writing in place.
    A raw binary request yields one input named `RAW_INPUT_NAME` with ``datatype == ""`` and
    ``shape == ()`` (both unknown) and the whole body as flat uint8 ``data``; `bind_raw_input`
    maps it to the model's only input. An input in shared memory has ``shared_memory`` set
    and empty ``data`` until the infer handler reads it from its region.
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: npt.NDArray[Any]
    shared_memory: SharedMemoryRef | None = None


@dataclass(slots=True)
class RequestedOutput:
    """An entry of the request's ``outputs``; ``binary_data`` None means the request default,
    ``shared_memory`` set means the output goes to that place instead of the response."""

    name: str
    binary_data: bool | None = None
    classification: int = 0
    shared_memory: SharedMemoryRef | None = None


@dataclass(slots=True)
class InferRequest:
    """A decoded infer request.

    ``id`` is None when absent (an empty string is kept but never echoed). ``outputs`` is None
    when the request names none: return every model output, binary if ``binary_data_output``.
    ``parameters`` holds every request parameter as sent, reserved ones included; the reserved
    ones are also validated and parsed into the fields below (``timeout`` in microseconds).
    ``uses_shared_memory``: some input or requested output is in shared memory.
    """

    id: str | None
    inputs: list[InferInput]
    outputs: list[RequestedOutput] | None
    parameters: dict[str, Any]
    binary_data_output: bool
    priority: int
    timeout_us: int
    uses_shared_memory: bool = False


def parse_header_length(value: str | None, *, content_length: int) -> int | None:
    """Parse ``Inference-Header-Content-Length``; None when the header is absent.

    ``content_length`` is the (decompressed) body length; the result lies in
    ``[0, content_length]``, 0 meaning a raw binary request.
    """
    if value is None:
        return None
    if not _INTEGER_RE.fullmatch(value):
        raise InvalidArgumentError(f"Unable to parse {_HEADER}, got: {value}")
    parsed = int(value)
    if not _INT32_MIN <= parsed <= _INT32_MAX:
        raise InvalidArgumentError(
            f"Unable to parse {_HEADER}, value is out of range "
            f"[ {_INT32_MIN}, {_INT32_MAX} ], got: {value}"
        )
    if parsed < 0 or parsed > content_length:
        raise InvalidArgumentError(
            f"inference header size should be in range (0, {content_length}), got: {value}"
        )
    return parsed


def decode_infer_request(
    body: bytes | memoryview,
    *,
    header_length: int | None,
    model: str,
    max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES,
) -> InferRequest:
    """Decode an infer request body (already decompressed) into an `InferRequest`.

    ``header_length`` is `parse_header_length`'s result: None means the whole body is JSON, 0
    means a raw binary request, otherwise the body is that many bytes of JSON followed by the
    binary inputs in ``inputs`` order. ``model`` only appears in error texts. Checks what the
    request alone shows (structure, types, value ranges, sizes against shapes); checks against
    the model configuration are the caller's. Inputs and outputs in shared memory are
    parsed into their places (see `data_plane.protocol.shared_memory`), not read. Raises
    `InvalidArgumentError`, or `SharedMemoryRequestError` for a shared-memory parameter of
    the wrong type.
    """
    view = memoryview(body).cast("B")
    if header_length == 0:
        if len(view) > max_input_bytes:
            raise InvalidArgumentError(
                f"Raw input has a byte_size ({len(view)} bytes) that exceeds the maximum "
                f"allowed value of {max_input_bytes} bytes. {LIMIT_HINT}"
            )
        raw = InferInput(RAW_INPUT_NAME, "", (), np.frombuffer(view, dtype=np.uint8))
        return InferRequest(None, [raw], None, {}, True, 0, 0)

    json_length = len(view) if header_length is None else header_length
    if json_length > max_input_bytes:
        raise InvalidArgumentError(
            f"request JSON size of {json_length} bytes exceeds the maximum allowed input size "
            f"of {max_input_bytes} bytes. {LIMIT_HINT}"
        )
    if json_length > len(view):
        raise InvalidArgumentError(
            f"unexpected size for request JSON, expecting {json_length - len(view)} more bytes"
        )
    try:
        header = orjson.loads(view[:json_length])
    except orjson.JSONDecodeError as exc:
        raise InvalidArgumentError(
            f"failed to parse the request JSON buffer: {exc.msg} at {exc.pos}"
        ) from None
    if not isinstance(header, dict):
        header = {}  # Triton looks members up on any value; a non-object has none.

    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidArgumentError(f"Unable to parse 'id': {NOT_STRING}")
    request = InferRequest(request_id, [], None, {}, False, 0, 0)
    if "parameters" in header:
        _parse_parameters(header["parameters"], request)

    inputs = header.get("inputs")
    if not isinstance(inputs, list):
        reason = NOT_ARRAY if "inputs" in header else _missing("inputs")
        raise InvalidArgumentError(f"Unable to parse 'inputs': {reason}")
    ctx = _Context(
        view=view,
        offset=json_length,
        has_header_length=header_length is not None,
        model=model,
        max_input_bytes=max_input_bytes,
        prefix=request_prefix(request_id),
    )
    seen: set[str] = set()
    for entry in inputs:
        request.inputs.append(_parse_input(entry, ctx, seen))
    if ctx.offset != len(view):
        raise InvalidArgumentError(f"unexpected additional input data for model '{model}'")
    request.uses_shared_memory = ctx.uses_shared_memory
    if "outputs" in header:
        request.outputs = _parse_outputs(header["outputs"], request)
    return request


def bind_raw_input(
    raw: InferInput,
    *,
    model: str,
    name: str,
    datatype: str,
    dims: Sequence[int],
    max_batch_size: int,
    request_id: str | None = None,
) -> InferInput:
    """Map a raw binary request's input onto the model's only input, as Triton's core does.

    ``dims`` are the input's configured dims (-1 = variable). Batching models
    (``max_batch_size > 0``) get batch 1; one variable dim is deduced from the byte count; a
    BYTES input must have exactly one element, which is the whole body. The caller checks that
    the model has exactly one input. Numeric results are zero-copy views (read-only).
    """
    prefix = request_prefix(request_id)
    shape = ([1] if max_batch_size != 0 else []) + list(dims)
    variable = [i for i, d in enumerate(shape) if d == -1]
    if len(variable) > 1:
        raise InvalidArgumentError(
            f"{prefix}The shape of the raw input '{name}' can not be deduced because there "
            "are more than one variable-sized dimension"
        )
    body = np.ascontiguousarray(raw.data, dtype=np.uint8).data
    if datatype == "BYTES":
        if variable or math.prod(shape) != 1:
            raise InvalidArgumentError(
                f"{prefix}For BYTE datatype raw input '{name}', the model must have input shape [1]"
            )
        data = np.empty(1, dtype=object)
        data[0] = bytes(body)
        return InferInput(name, datatype, tuple(shape), data.reshape(shape))
    if variable:
        fixed = math.prod(d for d in shape if d != -1) * ELEMENT_BYTES[datatype]
        shape[variable[0]] = len(body) // fixed if fixed else 0
    data = decode_binary(name, datatype, tuple(shape), body, model, prefix)
    return InferInput(name, datatype, tuple(shape), data)


@dataclass(slots=True)
class _Context:
    """What parsing the inputs needs besides the entry itself; ``offset`` advances."""

    view: memoryview
    offset: int
    has_header_length: bool
    model: str
    max_input_bytes: int
    prefix: str
    uses_shared_memory: bool = False


def _missing(member: str) -> str:
    return f"attempt to access non-existing object member '{member}'"


_UINT64_END = 1 << 64


def _is_uint(value: object) -> bool:
    return type(value) is int and value >= 0


def _parse_parameters(params: object, request: InferRequest) -> None:
    if not isinstance(params, dict):
        raise InvalidArgumentError(
            "failed to get request params.: attempt to get members for non-object"
        )
    for key, value in params.items():
        if key == "sequence_id":
            # Triton reads it as a uint64 or a string: a larger number is neither.
            if not ((_is_uint(value) and value < _UINT64_END) or isinstance(value, str)):
                raise InvalidArgumentError(f"Unable to parse 'sequence_id': {NOT_STRING}")
        elif key in ("sequence_start", "sequence_end", "binary_data_output"):
            if type(value) is not bool:
                raise InvalidArgumentError(f"Unable to parse '{key}': {NOT_BOOL}")
            if key == "binary_data_output":
                request.binary_data_output = value
        elif key in ("priority", "timeout"):
            if not _is_uint(value):
                raise InvalidArgumentError(f"Unable to parse '{key}': {NOT_UINT}")
            if key == "priority":
                request.priority = value
            else:
                request.timeout_us = value
        elif key.startswith("triton_"):
            raise InvalidArgumentError(
                "parameter keys starting with 'triton_' are reserved for Triton usage "
                "and should not be specified."
            )
        elif not isinstance(value, str | int | float):  # bool is an int
            raise InvalidArgumentError(
                f"parameter '{key}' has invalid type. It should be either "
                "'int', 'bool', or 'string'."
            )
    request.parameters = params


def _parse_input(entry: object, ctx: _Context, seen: set[str]) -> InferInput:
    """Parse one ``inputs`` entry in Triton's order of checks, consuming its binary data."""
    fields = entry if isinstance(entry, dict) else {}
    params = fields.get("parameters")
    params = params if isinstance(params, dict) else {}
    present = [
        label
        for label, is_set in (
            ("'data'", "data" in fields),
            ("'binary_data_size'", "binary_data_size" in params),
            ("'shared_memory_region'", REGION_PARAMETER in params),
        )
        if is_set
    ]
    if len(present) != 1:
        raise InvalidArgumentError(
            "Input must set only one of the following fields: 'data', 'binary_data_size' in "
            "'parameters', 'shared_memory_region' in 'parameters'. But "
            + (f"set {' '.join(present)}" if present else "no field is set")
        )
    name = _member_string(fields, "name")
    datatype = _member_string(fields, "datatype")
    shape_json = fields.get("shape")
    if not isinstance(shape_json, list):
        reason = NOT_ARRAY if "shape" in fields else _missing("shape")
        raise InvalidArgumentError(f"Unable to parse 'shape': {reason}")
    if not all(map(_is_uint, shape_json)):
        raise InvalidArgumentError(f"Unable to parse 'shape': {NOT_UINT}")
    shape = tuple(shape_json)
    if name in seen:
        raise InvalidArgumentError(f"{ctx.prefix}input '{name}' already exists in request")
    seen.add(name)
    if datatype not in NUMPY_DTYPES:
        raise InvalidArgumentError(
            f"invalid datatype for input {name}: '{datatype}' is not a protocol datatype"
        )
    check_shape(name, datatype, shape, ctx.prefix)
    if REGION_PARAMETER in params:
        ctx.uses_shared_memory = True
        return InferInput(name, datatype, shape, _NO_DATA, shared_memory_ref(params))
    if "data" in fields:
        data = decode_json_data(
            name,
            datatype,
            shape,
            fields["data"],
            model=ctx.model,
            prefix=ctx.prefix,
            max_input_bytes=ctx.max_input_bytes,
        )
        return InferInput(name, datatype, shape, data)

    size = params["binary_data_size"]
    if not _is_uint(size):
        raise InvalidArgumentError(f"Unable to parse 'binary_data_size': {NOT_UINT}")
    if size and not ctx.has_header_length:
        raise InvalidArgumentError(
            "must specify valid 'Infer-Header-Content-Length' in request header and "
            "'binary_data_size' when passing inputs in binary data format"
        )
    chunk = ctx.view[ctx.offset : ctx.offset + size]
    if len(chunk) < size:
        raise InvalidArgumentError(
            f"unexpected size for input '{name}', expecting {size - len(chunk)} additional "
            f"bytes for model '{ctx.model}'"
        )
    ctx.offset += size
    data = decode_binary(name, datatype, shape, chunk, ctx.model, ctx.prefix)
    return InferInput(name, datatype, shape, data)


def check_shape(name: str, datatype: str, shape: tuple[int, ...], prefix: str) -> None:
    """Refuse shapes no array can take. The data-size checks catch most, but a zero-element
    shape passes them whatever its other dimensions, and numpy then fails on it."""
    if len(shape) > _MAX_DIMS:
        raise InvalidArgumentError(
            f"{prefix}input '{name}' has {len(shape)} dimensions, more than the {_MAX_DIMS} "
            "supported"
        )
    # numpy's own rule: the element size times the non-zero dimensions must fit its sizes.
    size = np.dtype(NUMPY_DTYPES[datatype]).itemsize
    for dim in shape:
        size *= dim or 1
        if size > _MAX_SIZE:
            raise InvalidArgumentError(
                f"{prefix}input '{name}' has shape {list(shape)}, too large to hold: its "
                f"non-zero dimensions times the {datatype} element size exceed {_MAX_SIZE}"
            )


def _member_string(fields: dict[str, Any], member: str) -> str:
    value = fields.get(member)
    if not isinstance(value, str):
        reason = NOT_STRING if member in fields else _missing(member)
        raise InvalidArgumentError(f"Unable to parse '{member}': {reason}")
    return value


def _parse_outputs(outputs: object, request: InferRequest) -> list[RequestedOutput]:
    prefix = request_prefix(request.id)
    if not isinstance(outputs, list):
        raise InvalidArgumentError(f"Unable to parse 'outputs': {NOT_ARRAY}")
    requested: list[RequestedOutput] = []
    seen: set[str] = set()
    for entry in outputs:
        fields = entry if isinstance(entry, dict) else {}
        params = fields.get("parameters")
        params = params if isinstance(params, dict) else {}
        uses_shm = REGION_PARAMETER in params
        if uses_shm and "classification" in params:
            raise InvalidArgumentError(
                "Output can't set both 'shared_memory_region' and 'classification'"
            )
        if uses_shm and params.get("binary_data") is True:
            raise InvalidArgumentError(
                "Output can't set both 'shared_memory_region' and 'binary_data'"
            )
        name = _member_string(fields, "name")
        if name in seen:
            raise InvalidArgumentError(f"{prefix}output '{name}' already exists in request")
        seen.add(name)
        count = params.get("classification", 0)
        if not _is_uint(count):
            raise InvalidArgumentError(f"Unable to set 'classification': {NOT_UINT}")
        binary = params.get("binary_data")
        if binary is not None and type(binary) is not bool:
            raise InvalidArgumentError(f"Unable to parse 'binary_data': {NOT_BOOL}")
        place = None
        if uses_shm:
            place = shared_memory_ref(params)
            request.uses_shared_memory = True
        requested.append(RequestedOutput(name, binary, count, place))
    return requested
