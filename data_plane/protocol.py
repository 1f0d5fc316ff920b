"""Codec for Open Inference Protocol (KServe V2) infer requests and responses.

Covers the JSON body and Triton's binary tensor data extension (a JSON header followed by raw
tensor bytes, its length in ``Inference-Header-Content-Length``), plus the classification
extension. Transport-free: the HTTP routes pass bytes and header values in and write what comes
back; request compression lives in `data_plane.compression`.

Errors use Triton's texts (``shared/research/triton.md`` §1.5-§1.9 and the server source they
cite) so that tools matching on them keep working. Texts that Triton raises in its core rather
than its HTTP frontend carry the ``[request id: <id>] `` prefix, as Triton's do.

Tensors inside the server are numpy arrays with ``datatypes.NUMPY_DTYPES`` dtypes: BYTES is an
object array of ``bytes`` and BF16 is float32 (the wire carries the upper 16 bits).
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any, Final, NoReturn

import numpy as np
import numpy.typing as npt
import orjson

from data_plane.datatypes import ELEMENT_BYTES, NUMPY_DTYPES, protocol_from_numpy
from data_plane.errors import InvalidArgumentError, UnsupportedError, request_prefix

__all__ = [
    "DEFAULT_MAX_INPUT_BYTES",
    "RAW_INPUT_NAME",
    "InferInput",
    "InferRequest",
    "OutputTensor",
    "RequestedOutput",
    "bind_raw_input",
    "classify",
    "decode_infer_request",
    "encode_infer_response",
    "parse_header_length",
]

DEFAULT_MAX_INPUT_BYTES: Final = 64 * 2**20
"""Triton's ``--http-max-input-size`` default."""
RAW_INPUT_NAME: Final = "raw_input"
"""Name of the single input of a raw binary request (``Inference-Header-Content-Length: 0``)."""

_HEADER: Final = "Inference-Header-Content-Length"
_MAX_JSON_DEPTH: Final = 100
_MAX_CLASSIFICATION_ELEMENTS: Final = 1_000_000
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_LENGTH: Final = struct.Struct("<I")
_WIRE_DTYPES: Final = {  # little-endian on the wire; BF16 travels as its upper 16 bits
    **{dt: np.dtype(NUMPY_DTYPES[dt]).newbyteorder("<") for dt in ELEMENT_BYTES},
    "BF16": np.dtype("<u2"),
}
_INTEGER_RE: Final = re.compile(r"\s*[+-]?[0-9]+\s*")
_LIMIT_HINT: Final = "Use --http-max-input-size to increase the limit."

# TritonJson's type errors, which Triton appends to "Unable to parse '<field>': ".
_NOT_STRING: Final = "attempt to access JSON non-string as string"
_NOT_UINT: Final = "attempt to access JSON non-unsigned-integer as unsigned-integer"
_NOT_INT: Final = "attempt to access JSON non-signed-integer as signed-integer"
_NOT_BOOL: Final = "attempt to access JSON non-boolean as boolean"
_NOT_NUMBER: Final = "attempt to access JSON non-number as double"
_NOT_ARRAY: Final = "attempt to access JSON non-array as array"


@dataclass(slots=True)
class InferInput:
    """One decoded input tensor.

    ``data`` has shape ``shape`` and dtype ``NUMPY_DTYPES[datatype]``. Binary numeric inputs are
    zero-copy views of the request body and therefore read-only; copy before writing in place.
    A raw binary request yields one input named `RAW_INPUT_NAME` with ``datatype == ""`` and
    ``shape == ()`` (both unknown) and the whole body as flat uint8 ``data``; `bind_raw_input`
    maps it to the model's only input.
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: npt.NDArray[Any]


@dataclass(slots=True)
class RequestedOutput:
    """An entry of the request's ``outputs``; ``binary_data`` None means the request default."""

    name: str
    binary_data: bool | None = None
    classification: int = 0


@dataclass(slots=True)
class InferRequest:
    """A decoded infer request.

    ``id`` is None when absent (an empty string is kept but never echoed). ``outputs`` is None
    when the request names none: return every model output, binary if ``binary_data_output``.
    ``parameters`` holds every request parameter as sent, reserved ones included; the reserved
    ones are also validated and parsed into the fields below (``timeout`` in microseconds).
    """

    id: str | None
    inputs: list[InferInput]
    outputs: list[RequestedOutput] | None
    parameters: dict[str, Any]
    binary_data_output: bool
    priority: int
    timeout_us: int


@dataclass(slots=True)
class OutputTensor:
    """One response output.

    ``datatype`` is a protocol name and ``data`` is in server form (see the module docstring);
    data of another dtype is converted to the datatype's. ``binary`` picks the binary extension
    over a JSON ``data`` array for this output.
    """

    name: str
    datatype: str
    data: npt.NDArray[Any]
    binary: bool


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
    the model configuration are the caller's. Raises `InvalidArgumentError`, or
    `UnsupportedError` for shared memory.
    """
    view = memoryview(body).cast("B")
    if header_length == 0:
        if len(view) > max_input_bytes:
            raise InvalidArgumentError(
                f"Raw input has a byte_size ({len(view)} bytes) that exceeds the maximum "
                f"allowed value of {max_input_bytes} bytes. {_LIMIT_HINT}"
            )
        raw = InferInput(RAW_INPUT_NAME, "", (), np.frombuffer(view, dtype=np.uint8))
        return InferRequest(None, [raw], None, {}, True, 0, 0)

    json_length = len(view) if header_length is None else header_length
    if json_length > max_input_bytes:
        raise InvalidArgumentError(
            f"request JSON size of {json_length} bytes exceeds the maximum allowed input size "
            f"of {max_input_bytes} bytes. {_LIMIT_HINT}"
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
        raise InvalidArgumentError(f"Unable to parse 'id': {_NOT_STRING}")
    request = InferRequest(request_id, [], None, {}, False, 0, 0)
    if "parameters" in header:
        _parse_parameters(header["parameters"], request)

    inputs = header.get("inputs")
    if not isinstance(inputs, list):
        reason = _NOT_ARRAY if "inputs" in header else _missing("inputs")
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
    if "outputs" in header:
        request.outputs = _parse_outputs(header["outputs"], ctx.prefix)
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
    data = _decode_binary(name, datatype, tuple(shape), body, model, prefix)
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


def _missing(member: str) -> str:
    return f"attempt to access non-existing object member '{member}'"


def _is_uint(value: object) -> bool:
    return type(value) is int and value >= 0


def _parse_parameters(params: object, request: InferRequest) -> None:
    if not isinstance(params, dict):
        raise InvalidArgumentError(
            "failed to get request params.: attempt to get members for non-object"
        )
    for key, value in params.items():
        if key == "sequence_id":
            if not (_is_uint(value) or isinstance(value, str)):
                raise InvalidArgumentError(f"Unable to parse 'sequence_id': {_NOT_STRING}")
        elif key in ("sequence_start", "sequence_end", "binary_data_output"):
            if type(value) is not bool:
                raise InvalidArgumentError(f"Unable to parse '{key}': {_NOT_BOOL}")
            if key == "binary_data_output":
                request.binary_data_output = value
        elif key in ("priority", "timeout"):
            if not _is_uint(value):
                raise InvalidArgumentError(f"Unable to parse '{key}': {_NOT_UINT}")
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
            ("'shared_memory_region'", "shared_memory_region" in params),
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
        reason = _NOT_ARRAY if "shape" in fields else _missing("shape")
        raise InvalidArgumentError(f"Unable to parse 'shape': {reason}")
    if not all(map(_is_uint, shape_json)):
        raise InvalidArgumentError(f"Unable to parse 'shape': {_NOT_UINT}")
    shape = tuple(shape_json)
    if name in seen:
        raise InvalidArgumentError(f"{ctx.prefix}input '{name}' already exists in request")
    seen.add(name)
    if datatype not in NUMPY_DTYPES:
        raise InvalidArgumentError(
            f"invalid datatype for input {name}: '{datatype}' is not a protocol datatype"
        )
    if "shared_memory_region" in params:
        raise UnsupportedError(
            f"input '{name}' uses shared memory, which this server does not support; "
            "send its data in the request body"
        )
    if "data" in fields:
        data = _decode_json_data(name, datatype, shape, fields["data"], ctx)
        return InferInput(name, datatype, shape, data)

    size = params["binary_data_size"]
    if not _is_uint(size):
        raise InvalidArgumentError(f"Unable to parse 'binary_data_size': {_NOT_UINT}")
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
    data = _decode_binary(name, datatype, shape, chunk, ctx.model, ctx.prefix)
    return InferInput(name, datatype, shape, data)


def _member_string(fields: dict[str, Any], member: str) -> str:
    value = fields.get(member)
    if not isinstance(value, str):
        reason = _NOT_STRING if member in fields else _missing(member)
        raise InvalidArgumentError(f"Unable to parse '{member}': {reason}")
    return value


def _parse_outputs(outputs: object, prefix: str) -> list[RequestedOutput]:
    if not isinstance(outputs, list):
        raise InvalidArgumentError(f"Unable to parse 'outputs': {_NOT_ARRAY}")
    requested: list[RequestedOutput] = []
    seen: set[str] = set()
    for entry in outputs:
        fields = entry if isinstance(entry, dict) else {}
        params = fields.get("parameters")
        params = params if isinstance(params, dict) else {}
        uses_shm = "shared_memory_region" in params
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
            raise InvalidArgumentError(f"Unable to set 'classification': {_NOT_UINT}")
        if uses_shm:
            raise UnsupportedError(
                f"output '{name}' asks for shared memory, which this server does not support"
            )
        binary = params.get("binary_data")
        if binary is not None and type(binary) is not bool:
            raise InvalidArgumentError(f"Unable to parse 'binary_data': {_NOT_BOOL}")
        requested.append(RequestedOutput(name, binary, count))
    return requested


# JSON element types each datatype accepts, and the TritonJson text for anything else.
_JSON_ELEMENT_TYPES: Final[dict[str, tuple[frozenset[type], str]]] = {
    **{dt: (frozenset({int}), _NOT_UINT) for dt in ("UINT8", "UINT16", "UINT32", "UINT64")},
    **{dt: (frozenset({int}), _NOT_INT) for dt in ("INT8", "INT16", "INT32", "INT64")},
    "FP32": (frozenset({int, float}), _NOT_NUMBER),
    "FP64": (frozenset({int, float}), _NOT_NUMBER),
    "BOOL": (frozenset({bool}), _NOT_BOOL),
}
_INT_RANGES: Final = {
    dt: (0, 2 ** (8 * ELEMENT_BYTES[dt]) - 1)
    if dt.startswith("U")
    else (-(2 ** (8 * ELEMENT_BYTES[dt] - 1)), 2 ** (8 * ELEMENT_BYTES[dt] - 1) - 1)
    for dt in _JSON_ELEMENT_TYPES
    if "INT" in dt
}


def _decode_json_data(
    name: str, datatype: str, shape: tuple[int, ...], data: object, ctx: _Context
) -> npt.NDArray[Any]:
    """Convert an input's JSON ``data`` (flat or nested) to an array of ``shape``."""
    if not isinstance(data, list):
        raise InvalidArgumentError(f"Unable to parse 'data': {_NOT_ARRAY}")
    count = math.prod(shape)
    if datatype == "BYTES":
        flat, types = _flatten(data, "")
        if not types <= {str}:
            raise InvalidArgumentError(f"Unable to parse JSON bytes array: {_NOT_STRING}")
        elements = list(map(str.encode, flat))
        _check_json_size(name, sum(map(len, elements)) + 4 * len(elements), ctx)
        return _bytes_array(name, count, elements, ctx.model, ctx.prefix).reshape(shape)
    if datatype in ("FP16", "BF16"):
        raise InvalidArgumentError(
            f"receiving {datatype} data via JSON is not supported. Please use the binary "
            f"data format for input {name}"
        )
    _check_json_size(name, count * ELEMENT_BYTES[datatype], ctx)
    leaves: npt.NDArray[Any] | list[Any]
    inferred = _infer_numbers(data, datatype)
    if inferred is not None:
        _check_leaf_count(inferred.size, count)
        leaves = inferred
    else:
        flat, types = _flatten(data, "Unable to parse 'data': ")
        _check_leaf_count(len(flat), count)
        allowed, reason = _JSON_ELEMENT_TYPES[datatype]
        if not types <= allowed:
            raise InvalidArgumentError(f"Unable to parse 'data': {reason}")
        leaves = flat
    dtype = NUMPY_DTYPES[datatype]
    if dtype.kind in "iu" and count:
        # Triton narrows out-of-range integers silently; we refuse them instead.
        lowest, highest = _INT_RANGES[datatype]
        if isinstance(leaves, np.ndarray):
            low, high = int(leaves.min()), int(leaves.max())
        else:  # Python ints, which may exceed int64
            low, high = min(leaves), max(leaves)
        if low < 0 and dtype.kind == "u":
            raise InvalidArgumentError(f"Unable to parse 'data': {_NOT_UINT}")
        if low < lowest or high > highest:
            bad = low if low < lowest else high
            raise InvalidArgumentError(
                f"Unable to parse 'data': value {bad} of input '{name}' is out of range "
                f"for {datatype}"
            )
    with np.errstate(over="ignore"):  # FP32 overflow becomes inf, as Triton's cast does
        return np.asarray(leaves, dtype=dtype).reshape(shape)


# numpy kinds an inferred array may have for each datatype; anything else takes the exact path.
_INFERRED_KINDS: Final = {
    **{dt: "iu" for dt in _INT_RANGES},
    "FP32": "iuf",
    "FP64": "iuf",
    "BOOL": "b",
}


def _infer_numbers(data: list[Any], datatype: str) -> npt.NDArray[Any] | None:
    """Fast path: numpy's own inference, or None when only the exact path can decide.

    Uniformly nested numbers convert in one C pass. Ragged nesting, strings, nulls, floats
    given for integers and integers beyond int64 all come back None, so that `_flatten` and
    the type checks give Triton's answer. One leniency remains: JSON booleans mixed with
    numbers read as 0 and 1 (numpy does not keep their type), where Triton refuses them.
    """
    try:
        inferred = np.array(data)
    except (ValueError, OverflowError):  # ragged, or deeper than numpy's 64 dimensions
        return None
    if inferred.size and inferred.dtype.kind not in _INFERRED_KINDS[datatype]:
        return None
    return inferred


def _check_leaf_count(size: int, count: int) -> None:
    if size > count:
        raise InvalidArgumentError(
            "Unable to parse 'data': Shape does not match true shape of 'data' field"
        )
    if size < count:
        raise InvalidArgumentError("Failed to parse 'data' field: shape does not match true shape")


def _check_json_size(name: str, byte_size: int, ctx: _Context) -> None:
    if byte_size > ctx.max_input_bytes:
        raise InvalidArgumentError(
            f"JSON input '{name}' has a byte_size ({byte_size} bytes) that exceeds the maximum "
            f"allowed value of {ctx.max_input_bytes} bytes. {_LIMIT_HINT}"
        )


def _flatten(data: list[Any], context: str) -> tuple[list[Any], set[type]]:
    """Flatten nested lists level by level; returns the leaves and the set of their types.

    Each level is one C-level pass (``map``, ``chain``), not a per-element Python recursion.
    Like Triton, ragged nesting is accepted: only the leaf count is checked against the shape.
    """
    flat, depth = data, 1
    while True:
        if flat and depth >= _MAX_JSON_DEPTH:
            raise InvalidArgumentError(
                f"{context}JSON nesting depth exceeds maximum allowed limit ({_MAX_JSON_DEPTH})"
            )
        types = set(map(type, flat))
        if list not in types:
            return flat, types
        if len(types) == 1:
            flat = list(chain.from_iterable(flat))
        else:
            flat = list(chain.from_iterable(x if type(x) is list else (x,) for x in flat))
        depth += 1


def _decode_binary(
    name: str, datatype: str, shape: tuple[int, ...], chunk: memoryview, model: str, prefix: str
) -> npt.NDArray[Any]:
    """Decode one binary tensor; numeric types other than BF16 are zero-copy views."""
    count = math.prod(shape)
    if datatype == "BYTES":
        elements = _split_bytes(name, chunk, model, prefix, count)
        return _bytes_array(name, count, elements, model, prefix).reshape(shape)
    expected = count * ELEMENT_BYTES[datatype]
    if len(chunk) != expected:
        raise InvalidArgumentError(
            f"{prefix}input byte size mismatch for input '{name}' for model '{model}'. "
            f"Expected {expected}, got {len(chunk)}"
        )
    wire = np.frombuffer(chunk, dtype=_WIRE_DTYPES[datatype])
    if datatype == "BF16":
        return (wire.astype(np.uint32) << 16).view(np.float32).reshape(shape)
    if datatype == "BOOL" and count and wire.view(np.uint8).max() > 1:
        wire = wire.view(np.uint8) != 0  # numpy bools misbehave on bytes other than 0 and 1
    return wire.reshape(shape)


def _split_bytes(name: str, chunk: memoryview, model: str, prefix: str, count: int) -> list[bytes]:
    """Split ``uint32 LE length + bytes`` elements, checking as Triton's core does."""
    elements: list[bytes] = []
    unpack, end, pos = _LENGTH.unpack_from, len(chunk), 0
    while pos < end:
        if end - pos < 4:
            raise InvalidArgumentError(
                f"{prefix}incomplete string length indicator for inference input '{name}' for "
                f"model '{model}', expecting 4 bytes but only {end - pos} bytes available. "
                "Please make sure the string length indicator is in one buffer."
            )
        if len(elements) == count:  # stop early, as Triton does, before reading further
            _raise_string_count(name, count, count + 1, model, prefix)
        (length,) = unpack(chunk, pos)
        pos += 4
        if end - pos < length:  # Triton lets a truncated last element through
            raise InvalidArgumentError(
                f"{prefix}incomplete string data for inference input '{name}' for model "
                f"'{model}', expecting {length} bytes but only {end - pos} bytes available"
            )
        elements.append(bytes(chunk[pos : pos + length]))
        pos += length
    return elements


def _bytes_array(
    name: str, count: int, elements: list[bytes], model: str, prefix: str
) -> npt.NDArray[Any]:
    if len(elements) != count:
        _raise_string_count(name, count, len(elements), model, prefix)
    array = np.empty(count, dtype=object)
    array[:] = elements
    return array


def _raise_string_count(name: str, count: int, got: int, model: str, prefix: str) -> NoReturn:
    where = f"for inference input '{name}' for model '{model}'"
    if got > count:
        raise InvalidArgumentError(
            f"{prefix}unexpected number of string elements {count + 1} {where}, expecting {count}"
        )
    raise InvalidArgumentError(f"{prefix}expected {count} string elements {where}, got {got}")


def encode_infer_response(
    *,
    model_name: str,
    model_version: str,
    request_id: str | None,
    outputs: Sequence[OutputTensor],
    parameters: Mapping[str, Any] | None = None,
) -> tuple[bytes, int | None]:
    """Encode an infer response; returns the body and its JSON header length.

    The header length is None when no binary output has data: the body is then plain JSON
    (``Content-Type: application/json``, no ``Inference-Header-Content-Length``), though empty
    binary outputs still carry ``binary_data_size: 0``, as Triton does. Otherwise the body is the
    JSON followed by the binary outputs' bytes in ``outputs`` order
    (``application/octet-stream``). JSON ``data`` is flat; FP16 and BF16 go out as numbers
    (Triton refuses them as JSON; tritonclient reads them fine) and NaN/inf as null (JSON has
    neither). BYTES go out as strings; an output holding bytes that are not UTF-8 is sent
    binary instead, since JSON cannot carry them and tritonclient reads either form.
    """
    entries: list[dict[str, Any]] = []
    buffers: list[bytes | memoryview] = []  # joined into the body: the only copy
    for output in outputs:
        shape = output.data.shape
        entry: dict[str, Any] = {"name": output.name, "datatype": output.datatype, "shape": shape}
        payload: bytes | npt.NDArray[Any] | None = None
        if output.datatype == "BYTES":
            elements = [_as_bytes(e) for e in np.ravel(output.data, order="C").tolist()]
            texts = None if output.binary else _utf8_or_none(elements)
            if texts is None:
                pairs = ((_LENGTH.pack(len(e)), e) for e in elements)
                payload = b"".join(chain.from_iterable(pairs))
            else:
                entry["data"] = texts
        elif output.binary:
            payload = _wire_array(output.datatype, output.data)
        else:
            entry["data"] = _json_array(output.datatype, _wire_array(output.datatype, output.data))
        if payload is not None:
            size = len(payload) if isinstance(payload, bytes) else payload.nbytes
            entry["parameters"] = {"binary_data_size": size}
            if size:
                buffers.append(payload if isinstance(payload, bytes) else payload.data)
        entries.append(entry)

    response: dict[str, Any] = {}
    if request_id:
        response["id"] = request_id
    response["model_name"] = model_name
    response["model_version"] = model_version
    if parameters:
        response["parameters"] = dict(parameters)
    response["outputs"] = entries
    head = orjson.dumps(response, option=orjson.OPT_SERIALIZE_NUMPY)
    if not buffers:
        return head, None
    return b"".join([head, *buffers]), len(head)


def _as_bytes(element: object) -> bytes:
    """A BYTES element as bytes; str is UTF-8 encoded and anything else ``str()``-ed first,
    as tritonclient's ``serialize_byte_tensor`` does."""
    if isinstance(element, bytes):
        return element
    return (element if isinstance(element, str) else str(element)).encode()


def _utf8_or_none(elements: list[bytes]) -> list[str] | None:
    try:
        return [e.decode() for e in elements]
    except UnicodeDecodeError:
        return None


def _wire_array(datatype: str, data: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """``data`` as a C-contiguous little-endian array of the wire type (no copy if it is one)."""
    if datatype == "BF16":
        return _to_bf16_bits(np.asarray(data, dtype=np.float32))
    return np.ascontiguousarray(data, dtype=_WIRE_DTYPES[datatype])


def _to_bf16_bits(values: npt.NDArray[np.float32]) -> npt.NDArray[np.uint16]:
    """Upper 16 bits of float32 with round-to-nearest-even; NaN stays a (quiet) NaN."""
    bits = np.ascontiguousarray(values, dtype="<f4").view(np.uint32)
    rounded = (bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16  # wraps only for NaN, fixed below
    quiet_nan = (bits >> 16) | 0x0040
    return np.where(np.isnan(values), quiet_nan, rounded).astype("<u2")


def _json_array(datatype: str, wire: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """A flat array orjson serializes natively (it has no float16 support)."""
    if datatype == "BF16":
        return (wire.astype(np.uint32) << 16).view(np.float32).ravel()
    if datatype == "FP16":
        return wire.astype(np.float32).ravel()
    return wire.ravel()


_CLASSIFIABLE_KINDS: Final = frozenset("iuf")


def classify(
    data: npt.NDArray[Any], count: int, *, batching: bool, labels: Sequence[str] | None
) -> npt.NDArray[Any]:
    """Triton's classification extension: the top ``count`` entries of an output as BYTES.

    Each element is ``b"<value>:<index>[:<label>]"``, highest value first (ties: lower index
    first); values print as C's ``std::to_string`` does (``%f`` for floats); the label is
    ``labels[index]`` when present and non-empty. With ``batching`` (a model with
    ``max_batch_size > 0``) and a non-empty first dimension, each batch entry is classified on
    its own and the shape is ``(batch, min(count, per_entry))``; else ``(min(count, size),)``.
    BF16 outputs (float32 inside the server) classify as FP32; FP16, BOOL and BYTES are
    refused, as Triton refuses them.
    """
    if data.dtype.kind not in _CLASSIFIABLE_KINDS or data.dtype == np.float16:
        raise InvalidArgumentError(
            "class result not available for output due to unsupported type "
            f"'{protocol_from_numpy(data.dtype)}'"
        )
    is_batched = batching and data.ndim > 0 and data.shape[0] > 0
    rows = data.reshape(data.shape[0] if is_batched else 1, -1)
    if rows.shape[1] > _MAX_CLASSIFICATION_ELEMENTS:
        raise InvalidArgumentError("classification output tensor too large")
    top = min(count, rows.shape[1])
    # Stable descending order: sort the reversed rows ascending, then flip back.
    width = rows.shape[1]
    order = (width - 1 - np.argsort(rows[:, ::-1], axis=1, kind="stable"))[:, ::-1][:, :top]
    is_float = data.dtype.kind == "f"
    texts: list[bytes] = []
    for row, indices in zip(rows, order, strict=True):
        for index in indices.tolist():
            value = row[index]
            text = f"{float(value):f}:{index}" if is_float else f"{int(value)}:{index}"
            if labels is not None and index < len(labels) and labels[index]:
                text = f"{text}:{labels[index]}"
            texts.append(text.encode())
    result = np.empty(len(texts), dtype=object)
    result[:] = texts
    return result.reshape((rows.shape[0], top) if is_batched else (top,))
