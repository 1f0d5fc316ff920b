"""Encoding infer responses: `OutputTensor` and the JSON or JSON-plus-binary response body.

Owns the response side of the codec: which outputs go out as JSON ``data`` and which as binary
tensor data, how server-form arrays (see `data_plane.protocol`) become wire arrays (BF16
rounding, FP16 as JSON numbers) and how BYTES elements are framed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from data_plane.protocol.shared_memory import SharedMemoryRef
from data_plane.protocol.tensors import LENGTH_PREFIX, WIRE_DTYPES


@dataclass(slots=True)
class OutputTensor:
    """One response output.

    ``datatype`` is a protocol name and ``data`` is in server form (see `data_plane.protocol`);
    data of another dtype is converted to the datatype's. ``binary`` picks the binary extension
    over a JSON ``data`` array for this output. ``shared_memory`` set: the output was written
    to that place, and the response carries only its name, datatype and shape (as Triton's).
    """

    name: str
    datatype: str
    data: npt.NDArray[Any]
    binary: bool
    shared_memory: SharedMemoryRef | None = None


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
        if output.shared_memory is not None:
            entries.append(entry)
            continue
        payload: bytes | npt.NDArray[Any] | None = None
        if output.datatype == "BYTES":
            elements = bytes_elements(output.data)
            texts = None if output.binary else _utf8_or_none(elements)
            if texts is None:
                payload = frame_bytes(elements)
            else:
                entry["data"] = texts
        elif output.binary:
            payload = wire_array(output.datatype, output.data)
        else:
            entry["data"] = _json_array(output.datatype, wire_array(output.datatype, output.data))
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


def bytes_elements(data: npt.NDArray[Any]) -> list[bytes]:
    """A BYTES tensor's elements in C order, as bytes."""
    return [_as_bytes(e) for e in np.ravel(data, order="C").tolist()]


def frame_bytes(elements: list[bytes]) -> bytes:
    """BYTES elements as binary tensor data: each one prefixed with its length."""
    pairs = ((LENGTH_PREFIX.pack(len(e)), e) for e in elements)
    return b"".join(chain.from_iterable(pairs))


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


def wire_array(datatype: str, data: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """A numeric tensor (server form) as a C-contiguous little-endian array of its
    datatype's wire type, BF16 rounded to its upper 16 bits (no copy if it already is one)."""
    if datatype == "BF16":
        return _to_bf16_bits(np.asarray(data, dtype=np.float32))
    return np.ascontiguousarray(data, dtype=WIRE_DTYPES[datatype])


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
