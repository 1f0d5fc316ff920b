"""Tensors in an arena: write a numpy array into a block, read one back as its own copy.

A tensor crosses as a block of its raw bytes plus a descriptor in the message
(``{"name", "datatype", "shape", "offset", "nbytes"}``). Numeric arrays are their
C-order bytes; BYTES tensors are Triton's serialization (each element a 4-byte
little-endian length and its bytes), so that no element is ever pickled. Readers copy
the bytes out, so a block can be reused as soon as the message is handled, whatever the
model keeps.

Used on both sides of the channel; imports numpy and the standard library only.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable
from typing import Any, Final

import numpy as np

from runtimes.python_backend.arena import Arena

DTYPES: Final[dict[str, np.dtype[Any]]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}
"""Triton datatype -> numpy dtype, as the Python backend gives them to models."""

_DATATYPES: Final[dict[np.dtype[Any], str]] = {
    dtype: name for name, dtype in DTYPES.items() if name != "BYTES"
}
_LENGTH: Final = struct.Struct("<I")
_SMALL_BYTES: Final = 64 * 1024
"""Up to this size a numeric tensor is written through a bytes copy of it (the copy
costs less than setting up numpy's; past it, the second copy would cost more)."""


def datatype_of(array: np.ndarray) -> str:
    """The Triton datatype of ``array``; object, bytes and str arrays are BYTES.

    Raises ValueError for a dtype Triton has no datatype for.
    """
    datatype = _DATATYPES.get(array.dtype)
    if datatype is not None:
        return datatype
    if array.dtype.kind in "OSU":
        return "BYTES"
    datatype = _DATATYPES.get(array.dtype.newbyteorder("="))
    if datatype is None:
        raise ValueError(f"numpy dtype {array.dtype} has no Triton datatype")
    return datatype


def write(
    arena: Arena, name: str, array: np.ndarray, datatype: str | None = None
) -> dict[str, Any]:
    """Copy ``array`` into a new block of ``arena``; returns its descriptor. ``datatype``:
    the array's Triton datatype when the caller already knows it."""
    if datatype is None:
        datatype = datatype_of(array)
    if datatype == "BYTES":
        payload = serialize_bytes(array)
        nbytes = len(payload)
        offset = arena.allocate(nbytes)
        arena.view(offset, nbytes)[:] = payload
    else:
        nbytes = array.nbytes
        offset = arena.allocate(nbytes)
        if nbytes <= _SMALL_BYTES and array.dtype.isnative:
            # A small tensor's bytes in C order, copied in one slice assignment: a third
            # of the time of a numpy view of the block and an assignment into it.
            arena.view(offset, nbytes)[:] = array.tobytes()
        elif nbytes:
            target = np.frombuffer(arena.view(offset, nbytes), dtype=array.dtype.newbyteorder("="))
            target[...] = array.reshape(-1)
    # A numpy shape holds Python ints already.
    return {
        "name": name,
        "datatype": datatype,
        "shape": list(array.shape),
        "offset": offset,
        "nbytes": nbytes,
    }


def read(arena: Arena, descriptor: dict[str, Any]) -> np.ndarray:
    """A copy of the tensor ``descriptor`` places in ``arena``.

    Raises ValueError when the descriptor does not describe a well-formed tensor.
    """
    datatype = descriptor["datatype"]
    shape = tuple(map(int, descriptor["shape"]))
    nbytes = int(descriptor["nbytes"])
    view = arena.view(int(descriptor["offset"]), nbytes)
    count = math.prod(shape)
    if datatype == "BYTES":
        return deserialize_bytes(view, count).reshape(shape)
    dtype = DTYPES.get(datatype)
    if dtype is None:
        raise ValueError(f"unknown tensor datatype {datatype!r}")
    if count * dtype.itemsize != nbytes:
        raise ValueError(f"tensor of shape {list(shape)} and {datatype} cannot be {nbytes} bytes")
    return np.frombuffer(view, dtype=dtype, count=count).reshape(shape).copy()


def serialize_bytes(array: np.ndarray) -> bytes:
    """Triton's BYTES serialization: elements in C order, each a 4-byte length and its
    bytes; elements that are not bytes are written as their ``str`` in UTF-8."""
    parts: list[bytes] = []
    for item in _elements(array):
        data = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts.append(_LENGTH.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def deserialize_bytes(buffer: memoryview | bytes, count: int | None = None) -> np.ndarray:
    """The elements of a BYTES serialization as a flat object array of ``bytes``.

    With ``count`` given, exactly that many elements must fill the buffer.
    """
    items: list[bytes] = []
    offset = 0
    end = len(buffer)
    while offset < end:
        if offset + _LENGTH.size > end:
            raise ValueError("BYTES tensor ends inside an element's length")
        (length,) = _LENGTH.unpack_from(buffer, offset)
        offset += _LENGTH.size
        if offset + length > end:
            raise ValueError("BYTES tensor ends inside an element")
        items.append(bytes(buffer[offset : offset + length]))
        offset += length
    if count is not None and len(items) != count:
        raise ValueError(f"BYTES tensor holds {len(items)} elements, its shape says {count}")
    result = np.empty(len(items), dtype=np.object_)
    result[:] = items
    return result


def _elements(array: np.ndarray) -> Iterable[Any]:
    if array.dtype.kind == "U":
        return (item.encode("utf-8") for item in array.reshape(-1).tolist())
    return array.reshape(-1).tolist()
