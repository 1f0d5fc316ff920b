"""Binary tensor data: wire dtypes, decoding binary tensors and framing BYTES elements.

Owns Triton's binary tensor data extension on the decoding side (raw little-endian tensor
bytes, BYTES as ``uint32 LE length + bytes`` elements) and the object arrays BYTES tensors
become. The request decoder and `bind_raw_input` decode binary inputs here; the JSON data
decoder builds its BYTES arrays here; the response encoder takes the wire dtypes and the
length prefix from here.
"""

from __future__ import annotations

import math
import struct
from typing import Any, Final, NoReturn

import numpy as np
import numpy.typing as npt

from data_plane.errors import InvalidArgumentError
from foundation.datatypes import ELEMENT_BYTES, NUMPY_DTYPES

LENGTH_PREFIX: Final = struct.Struct("<I")
"""The ``uint32`` little-endian length before each BYTES element."""
WIRE_DTYPES: Final = {  # little-endian on the wire; BF16 travels as its upper 16 bits
    **{dt: np.dtype(NUMPY_DTYPES[dt]).newbyteorder("<") for dt in ELEMENT_BYTES},
    "BF16": np.dtype("<u2"),
}
"""The numpy dtype of each datatype's raw bytes on the wire."""


def decode_binary(
    name: str, datatype: str, shape: tuple[int, ...], chunk: memoryview, model: str, prefix: str
) -> npt.NDArray[Any]:
    """Decode one binary tensor; numeric types other than BF16 are zero-copy views."""
    count = math.prod(shape)
    if datatype == "BYTES":
        elements = _split_bytes(name, chunk, model, prefix, count)
        return bytes_array(name, count, elements, model, prefix).reshape(shape)
    expected = count * ELEMENT_BYTES[datatype]
    if len(chunk) != expected:
        raise byte_size_mismatch(name, model, prefix, expected=expected, got=len(chunk))
    wire = np.frombuffer(chunk, dtype=WIRE_DTYPES[datatype])
    if datatype == "BF16":
        return (wire.astype(np.uint32) << 16).view(np.float32).reshape(shape)
    if datatype == "BOOL" and count and wire.view(np.uint8).max() > 1:
        wire = wire.view(np.uint8) != 0  # numpy bools misbehave on bytes other than 0 and 1
    return wire.reshape(shape)


def byte_size_mismatch(
    name: str, model: str, prefix: str, *, expected: int, got: int
) -> InvalidArgumentError:
    """Triton's error for a numeric input whose byte count does not fit its shape."""
    return InvalidArgumentError(
        f"{prefix}input byte size mismatch for input '{name}' for model '{model}'. "
        f"Expected {expected}, got {got}"
    )


def _split_bytes(name: str, chunk: memoryview, model: str, prefix: str, count: int) -> list[bytes]:
    """Split ``uint32 LE length + bytes`` elements, checking as Triton's core does."""
    elements: list[bytes] = []
    unpack, end, pos = LENGTH_PREFIX.unpack_from, len(chunk), 0
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


def bytes_array(
    name: str, count: int, elements: list[bytes], model: str, prefix: str
) -> npt.NDArray[Any]:
    """A flat BYTES (object) array of ``elements``, which must number ``count``."""
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
