"""Decoding an input's JSON ``data`` array (flat or nested) into a numpy array.

Owns the element type and range checks Triton applies to JSON tensor data, with TritonJson's
error texts (which the request parser also uses for its own members), and the fast path that
lets numpy convert uniformly nested numbers in one pass.
"""

from __future__ import annotations

import math
from itertools import chain
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from data_plane.errors import InvalidArgumentError
from data_plane.protocol.tensors import bytes_array
from foundation.datatypes import ELEMENT_BYTES, NUMPY_DTYPES

_MAX_JSON_DEPTH: Final = 100
LIMIT_HINT: Final = "Use --http-max-input-size to increase the limit."
"""Triton's advice after every size-limit error."""

# TritonJson's type errors, which Triton appends to "Unable to parse '<field>': ".
NOT_STRING: Final = "attempt to access JSON non-string as string"
NOT_UINT: Final = "attempt to access JSON non-unsigned-integer as unsigned-integer"
_NOT_INT: Final = "attempt to access JSON non-signed-integer as signed-integer"
NOT_BOOL: Final = "attempt to access JSON non-boolean as boolean"
_NOT_NUMBER: Final = "attempt to access JSON non-number as double"
NOT_ARRAY: Final = "attempt to access JSON non-array as array"

# JSON element types each datatype accepts, and the TritonJson text for anything else.
_JSON_ELEMENT_TYPES: Final[dict[str, tuple[frozenset[type], str]]] = {
    **{dt: (frozenset({int}), NOT_UINT) for dt in ("UINT8", "UINT16", "UINT32", "UINT64")},
    **{dt: (frozenset({int}), _NOT_INT) for dt in ("INT8", "INT16", "INT32", "INT64")},
    "FP32": (frozenset({int, float}), _NOT_NUMBER),
    "FP64": (frozenset({int, float}), _NOT_NUMBER),
    "BOOL": (frozenset({bool}), NOT_BOOL),
}
_INT_RANGES: Final = {
    dt: (0, 2 ** (8 * ELEMENT_BYTES[dt]) - 1)
    if dt.startswith("U")
    else (-(2 ** (8 * ELEMENT_BYTES[dt] - 1)), 2 ** (8 * ELEMENT_BYTES[dt] - 1) - 1)
    for dt in _JSON_ELEMENT_TYPES
    if "INT" in dt
}


def decode_json_data(
    name: str,
    datatype: str,
    shape: tuple[int, ...],
    data: object,
    *,
    model: str,
    prefix: str,
    max_input_bytes: int,
) -> npt.NDArray[Any]:
    """Convert an input's JSON ``data`` (flat or nested) to an array of ``shape``.

    ``model`` and ``prefix`` (the request-id prefix) only appear in error texts.
    """
    if not isinstance(data, list):
        raise InvalidArgumentError(f"Unable to parse 'data': {NOT_ARRAY}")
    count = math.prod(shape)
    if datatype == "BYTES":
        flat, types = _flatten(data, "")
        if not types <= {str}:
            raise InvalidArgumentError(f"Unable to parse JSON bytes array: {NOT_STRING}")
        elements = list(map(str.encode, flat))
        _check_json_size(name, sum(map(len, elements)) + 4 * len(elements), max_input_bytes)
        return bytes_array(name, count, elements, model, prefix).reshape(shape)
    if datatype in ("FP16", "BF16"):
        raise InvalidArgumentError(
            f"receiving {datatype} data via JSON is not supported. Please use the binary "
            f"data format for input {name}"
        )
    _check_json_size(name, count * ELEMENT_BYTES[datatype], max_input_bytes)
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
            raise InvalidArgumentError(f"Unable to parse 'data': {NOT_UINT}")
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


def _check_json_size(name: str, byte_size: int, max_input_bytes: int) -> None:
    if byte_size > max_input_bytes:
        raise InvalidArgumentError(
            f"JSON input '{name}' has a byte_size ({byte_size} bytes) that exceeds the maximum "
            f"allowed value of {max_input_bytes} bytes. {LIMIT_HINT}"
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
