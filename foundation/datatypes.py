"""Tensor datatypes: protocol names, config enums and numpy dtypes in one table.

The wire speaks protocol names (``FP32``), config.pbtxt speaks enums (``TYPE_FP32``) and
runtimes speak numpy. BYTES tensors are numpy object arrays of ``bytes``. numpy has no
bfloat16, so BF16 tensors travel inside the server as float32 and are rounded on the wire.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from foundation.proto import model_config_pb2 as mc

NUMPY_DTYPES: Final[dict[str, np.dtype[np.generic]]] = {
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
    "BF16": np.dtype(np.float32),
    "BYTES": np.dtype(np.object_),
}
"""Protocol datatype -> the numpy dtype a tensor of it has inside the server."""

ELEMENT_BYTES: Final[dict[str, int]] = {
    "BOOL": 1, "UINT8": 1, "UINT16": 2, "UINT32": 4, "UINT64": 8,
    "INT8": 1, "INT16": 2, "INT32": 4, "INT64": 8,
    "FP16": 2, "FP32": 4, "FP64": 8, "BF16": 2,
}  # fmt: skip
"""Bytes per element on the wire; BYTES has no fixed size and is absent."""

_CONFIG_TO_PROTOCOL: Final[dict[int, str]] = {
    mc.TYPE_BOOL: "BOOL",
    mc.TYPE_UINT8: "UINT8",
    mc.TYPE_UINT16: "UINT16",
    mc.TYPE_UINT32: "UINT32",
    mc.TYPE_UINT64: "UINT64",
    mc.TYPE_INT8: "INT8",
    mc.TYPE_INT16: "INT16",
    mc.TYPE_INT32: "INT32",
    mc.TYPE_INT64: "INT64",
    mc.TYPE_FP16: "FP16",
    mc.TYPE_FP32: "FP32",
    mc.TYPE_FP64: "FP64",
    mc.TYPE_STRING: "BYTES",
    mc.TYPE_BF16: "BF16",
}
_PROTOCOL_TO_CONFIG: Final[dict[str, int]] = {v: k for k, v in _CONFIG_TO_PROTOCOL.items()}

_NUMPY_TO_PROTOCOL: Final[dict[np.dtype[np.generic], str]] = {
    dt: name for name, dt in NUMPY_DTYPES.items() if name != "BF16"
}


def protocol_from_config(data_type: int) -> str:
    """``TYPE_FP32`` (enum value) -> ``"FP32"``; raises KeyError for TYPE_INVALID."""
    return _CONFIG_TO_PROTOCOL[data_type]


def config_from_protocol(datatype: str) -> int:
    """``"FP32"`` -> the ``TYPE_FP32`` enum value; raises KeyError for unknown names."""
    return _PROTOCOL_TO_CONFIG[datatype]


def protocol_from_numpy(dtype: np.dtype[np.generic]) -> str:
    """numpy dtype -> protocol name (str and bytes arrays map to BYTES)."""
    if dtype.kind in ("U", "S", "O"):
        return "BYTES"
    return _NUMPY_TO_PROTOCOL[np.dtype(dtype)]


def is_known_datatype(datatype: str) -> bool:
    """Whether ``datatype`` is one of the protocol's names."""
    return datatype in NUMPY_DTYPES
