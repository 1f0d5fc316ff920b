"""Datatypes between the server and ONNX Runtime: type names and the values they disagree on.

The server names datatypes as the protocol does (``FP32``); ONNX Runtime names them as type
strings (``tensor(float)``) and the ONNX file as ``TensorProto`` element types. Two kinds of
values cross differently: BYTES tensors (object arrays of ``bytes``) become ONNX string
tensors (UTF-8 text) and back, and BF16 tensors (float32 inside the server) are rounded to
bfloat16 bits on the way in and widened on the way out.
"""

from __future__ import annotations

import ctypes
from typing import Any, Final

import numpy as np
import onnx
import onnxruntime as ort

from runtimes.errors import InvalidArgumentError

ORT_TYPES: Final[dict[str, str]] = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
    "tensor(bfloat16)": "BF16",
}
"""ONNX Runtime's type strings -> protocol datatypes; anything absent cannot be served."""

ONNX_ELEM_TYPES: Final[dict[int, str]] = {
    onnx.TensorProto.BOOL: "BOOL",
    onnx.TensorProto.UINT8: "UINT8",
    onnx.TensorProto.UINT16: "UINT16",
    onnx.TensorProto.UINT32: "UINT32",
    onnx.TensorProto.UINT64: "UINT64",
    onnx.TensorProto.INT8: "INT8",
    onnx.TensorProto.INT16: "INT16",
    onnx.TensorProto.INT32: "INT32",
    onnx.TensorProto.INT64: "INT64",
    onnx.TensorProto.FLOAT16: "FP16",
    onnx.TensorProto.FLOAT: "FP32",
    onnx.TensorProto.DOUBLE: "FP64",
    onnx.TensorProto.STRING: "BYTES",
    onnx.TensorProto.BFLOAT16: "BF16",
}
"""ONNX ``TensorProto`` element types -> protocol datatypes."""


def to_engine(name: str, datatype: str, array: np.ndarray) -> Any:
    """The value ONNX Runtime takes for input ``name`` of protocol ``datatype``."""
    if datatype == "BYTES":
        return _bytes_to_text(name, array)
    if datatype == "BF16":
        bits = _float32_to_bf16_bits(np.asarray(array, dtype=np.float32))
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
            bits, onnx_element_type=onnx.TensorProto.BFLOAT16
        )
    return array


def from_engine(datatype: str, array: np.ndarray) -> np.ndarray:
    """The server's array for an output of protocol ``datatype`` that ONNX Runtime returned."""
    if datatype == "BYTES":
        return _text_to_bytes(array)
    return array


def _bytes_to_text(name: str, array: np.ndarray) -> np.ndarray:
    """Object array of ``bytes`` -> object array of ``str`` (ORT wants UTF-8 text)."""
    out = np.empty(array.shape, dtype=object)
    flat = out.reshape(-1)
    for i, item in enumerate(array.reshape(-1)):
        if isinstance(item, str):
            flat[i] = item
            continue
        try:
            flat[i] = bytes(item).decode("utf-8")
        except (TypeError, UnicodeDecodeError) as exc:
            # ORT string tensors hold UTF-8; other bytes cannot cross its Python API.
            raise InvalidArgumentError(
                f"input {name!r} element {i} is not UTF-8 text, which ONNX string tensors need"
            ) from exc
    return out


def _text_to_bytes(array: np.ndarray) -> np.ndarray:
    """Object array of ``str`` (an ONNX string tensor) -> object array of ``bytes``."""
    out = np.empty(array.shape, dtype=object)
    flat = out.reshape(-1)
    for i, item in enumerate(array.reshape(-1)):
        flat[i] = item.encode("utf-8") if isinstance(item, str) else bytes(item)
    return out


def _float32_to_bf16_bits(array: np.ndarray) -> np.ndarray:
    """Round float32 to the nearest bfloat16 (ties to even), as uint16 bit patterns."""
    bits = np.ascontiguousarray(array).view(np.uint32)
    rounded = (bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16
    # Rounding a NaN payload can carry into the exponent or sign; keep it a quiet NaN.
    return np.where(np.isnan(array), np.uint32(0x7FC0), rounded).astype(np.uint16)


def bf16_ortvalue_to_float32(value: Any) -> np.ndarray:
    """A host ``OrtValue`` of bfloat16 -> float32 array of the same values (exact)."""
    shape = tuple(value.shape())
    size = int(value.tensor_size_in_bytes())
    raw = ctypes.string_at(value.data_ptr(), size) if size else b""
    bits = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
    return bits.view(np.float32).reshape(shape)
