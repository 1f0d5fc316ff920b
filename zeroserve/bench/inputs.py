"""Request inputs: shapes and datatypes from the model's V2 metadata, values random, zero or
read from a file.

The ``--input-data`` file follows perf_analyzer's "real input data" JSON, the subset that
matters for one model over HTTP::

    {"data": [
        {"INPUT0": [0.1, 0.2, 0.3, 0.4]},
        {"INPUT0": {"content": [[1, 2], [3, 4]], "shape": [2, 2]}},
        {"INPUT0": {"b64": "AACAPwAAAEA=", "shape": [2]}}
    ]}

Each entry of ``data`` gives every input of the model for **one sample**: without the batch
dimension when the model batches (``max_batch_size`` > 0), the whole tensor otherwise. A value
is a list (flat or nested; BYTES as strings), ``{"content": list, "shape": dims}``, or
``{"b64": base64 of the raw little-endian bytes}`` with an optional ``shape``. Where no shape
is given it is the metadata's, with ``--shape`` filling variable (``-1``) dimensions, and one
dimension still unknown is inferred from the element count. A request of batch size B takes
B consecutive entries (wrapping around), and requests cycle through the entries in order.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import numpy as np

WIRE_DTYPES: Final[dict[str, np.dtype[Any]]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    # numpy has no bfloat16: a BF16 tensor is held as its raw 16-bit patterns.
    "BF16": np.dtype("<u2"),
    "BYTES": np.dtype(np.object_),
}
"""Protocol datatype -> the numpy dtype whose bytes are the wire's (little-endian)."""

_STRING_LENGTH: Final = 8
"""Characters in each random BYTES element."""


class InputError(ValueError):
    """The model's inputs cannot be built as asked (unknown shape, bad input file...)."""


@dataclass(frozen=True)
class TensorSpec:
    """One input as the model's metadata describes it (``-1`` marks a variable dimension)."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Tensor:
    """One input of one request: its values as the numpy array whose bytes are the wire's."""

    name: str
    datatype: str
    array: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.array.shape)

    def raw_bytes(self) -> bytes:
        """The tensor as Triton's binary and raw forms carry it: little-endian values, or for
        BYTES each element prefixed with its 4-byte length."""
        if self.datatype == "BYTES":
            parts = []
            for value in self.array.ravel().tolist():
                raw = value if isinstance(value, bytes) else str(value).encode()
                parts.append(struct.pack("<I", len(raw)) + raw)
            return b"".join(parts)
        return np.ascontiguousarray(self.array).tobytes()


def parse_metadata(document: Mapping[str, Any]) -> list[TensorSpec]:
    """The inputs of a V2 model metadata answer (``GET /v2/models/{name}``)."""
    return parse_tensor_specs(document, "inputs")


def parse_tensor_specs(
    document: Mapping[str, Any], key: Literal["inputs", "outputs"]
) -> list[TensorSpec]:
    """The inputs or the outputs of a V2 model metadata answer."""
    try:
        specs = [
            TensorSpec(str(i["name"]), str(i["datatype"]), tuple(int(d) for d in i["shape"]))
            for i in document[key]
        ]
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"model metadata without usable {key!r}: {exc!r}") from None
    for spec in specs:
        if spec.datatype not in WIRE_DTYPES:
            raise InputError(f"{key[:-1]} {spec.name!r} has an unknown datatype {spec.datatype!r}")
    if not specs:
        raise InputError(f"the model's metadata lists no {key}")
    return specs


def is_batching(specs: Sequence[TensorSpec], config: Mapping[str, Any] | None) -> bool:
    """Whether the model's first dimension is the batch dimension.

    The model configuration says so (``max_batch_size`` > 0) where the server serves it
    (Triton's ``/config``); otherwise, as the metadata of a batching model starts every
    shape with ``-1``, that is taken to mean batching.
    """
    if config is not None and "max_batch_size" in config:
        return int(config["max_batch_size"]) > 0
    return all(spec.shape[:1] == (-1,) for spec in specs)


def sample_shape(
    spec: TensorSpec, *, is_batched: bool, overrides: Mapping[str, tuple[int, ...]]
) -> tuple[int, ...]:
    """One sample's shape (batch dimension excluded when batched); -1 where still unknown."""
    if spec.name in overrides:
        return overrides[spec.name]
    return spec.shape[1:] if is_batched else spec.shape


def request_shape(
    spec: TensorSpec,
    *,
    batch_size: int,
    is_batched: bool,
    overrides: Mapping[str, tuple[int, ...]],
) -> tuple[int, ...]:
    """The fully known shape of ``spec`` in a request of ``batch_size`` rows."""
    dims = sample_shape(spec, is_batched=is_batched, overrides=overrides)
    if any(d < 0 for d in dims):
        raise InputError(
            f"input {spec.name!r} has variable dimensions {list(spec.shape)}: give them with "
            f"--shape {spec.name}:" + ",".join("N" if d < 0 else str(d) for d in dims)
        )
    if is_batched:
        return (batch_size, *dims)
    if batch_size != 1:
        raise InputError("--batch-size needs a model that batches (max_batch_size > 0)")
    return dims


def generated_tensors(
    specs: Sequence[TensorSpec],
    *,
    fill: str,
    batch_size: int,
    is_batched: bool,
    overrides: Mapping[str, tuple[int, ...]],
    seed: int,
) -> list[Tensor]:
    """One request's inputs, ``random`` (seeded) or ``zero``: built once and reused, as
    perf_analyzer does, so that the client spends nothing per request on data."""
    if fill not in ("random", "zero"):
        raise InputError(f"unknown input fill {fill!r}: random or zero")
    rng = np.random.default_rng(seed)
    tensors = []
    for spec in specs:
        shape = request_shape(
            spec, batch_size=batch_size, is_batched=is_batched, overrides=overrides
        )
        if fill == "random":
            array = random_array(spec.datatype, shape, rng)
        else:
            array = zero_array(spec.datatype, shape)
        tensors.append(Tensor(spec.name, spec.datatype, array))
    return tensors


def random_array(datatype: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Random values of ``datatype``: floats in [0, 1), integers in [0, 100), random
    booleans, lowercase strings of 8 letters."""
    dtype = WIRE_DTYPES[datatype]
    if datatype == "BYTES":
        letters = rng.integers(ord("a"), ord("z") + 1, size=(*shape, _STRING_LENGTH))
        flat = [bytes(row.astype(np.uint8)) for row in letters.reshape(-1, _STRING_LENGTH)]
        return np.array(flat + [b""], dtype=np.object_)[:-1].reshape(shape)
    if datatype == "BOOL":
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if datatype == "BF16":
        # The upper 16 bits of float32 values in [0, 1).
        values = rng.random(size=shape, dtype=np.float32)
        return (values.view(np.uint32) >> 16).astype(dtype)
    if dtype.kind == "f":
        return rng.random(size=shape).astype(dtype)
    return rng.integers(0, 100, size=shape).astype(dtype)


def zero_array(datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Zeros (empty strings for BYTES)."""
    if datatype == "BYTES":
        array = np.empty(shape, dtype=np.object_)
        array.fill(b"")
        return array
    return np.zeros(shape, dtype=WIRE_DTYPES[datatype])


def load_input_data(
    path: Path,
    specs: Sequence[TensorSpec],
    *,
    batch_size: int,
    is_batched: bool,
    overrides: Mapping[str, tuple[int, ...]],
) -> list[list[Tensor]]:
    """The requests an ``--input-data`` file describes (format in the module docstring)."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"cannot read input data {path}: {exc}") from None
    return input_data_requests(
        document, specs, batch_size=batch_size, is_batched=is_batched, overrides=overrides
    )


def input_data_requests(
    document: Any,
    specs: Sequence[TensorSpec],
    *,
    batch_size: int,
    is_batched: bool,
    overrides: Mapping[str, tuple[int, ...]],
) -> list[list[Tensor]]:
    """:func:`load_input_data` on an already decoded document."""
    entries = document.get("data") if isinstance(document, dict) else None
    if not isinstance(entries, list) or not entries:
        raise InputError('input data must be {"data": [ {input name: value, ...}, ... ]}')
    if batch_size != 1 and not is_batched:
        raise InputError("--batch-size needs a model that batches (max_batch_size > 0)")
    samples: list[dict[str, np.ndarray]] = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise InputError(f"input data entry {index} is not an object")
        sample = {}
        for spec in specs:
            if spec.name not in entry:
                raise InputError(f"input data entry {index} has no value for {spec.name!r}")
            dims = sample_shape(spec, is_batched=is_batched, overrides=overrides)
            where = f"input data entry {index}, {spec.name!r}"
            sample[spec.name] = _decode_value(entry[spec.name], spec.datatype, dims, where)
        samples.append(sample)
    requests = []
    for first in range(len(samples)):
        rows = [samples[(first + k) % len(samples)] for k in range(batch_size)]
        tensors = []
        for spec in specs:
            parts = [row[spec.name] for row in rows]
            if len({p.shape for p in parts}) > 1:
                raise InputError(
                    f"input data for {spec.name!r}: samples batched together differ in shape"
                )
            array = np.stack(parts) if is_batched else parts[0]
            tensors.append(Tensor(spec.name, spec.datatype, array))
        requests.append(tensors)
    return requests


def _decode_value(value: Any, datatype: str, dims: tuple[int, ...], where: str) -> np.ndarray:
    shape: Sequence[int] = dims
    if isinstance(value, dict):
        if "shape" in value:
            try:
                shape = tuple(int(d) for d in value["shape"])
            except (TypeError, ValueError):
                raise InputError(f"{where}: 'shape' is not a list of integers") from None
        if "b64" in value:
            try:
                raw = base64.b64decode(value["b64"], validate=True)
            except (binascii.Error, TypeError, ValueError):
                raise InputError(f"{where}: 'b64' is not base64") from None
            if datatype == "BYTES":
                return _resolve(np.array([raw], dtype=np.object_), shape, where)
            dtype = WIRE_DTYPES[datatype]
            if len(raw) % dtype.itemsize:
                raise InputError(f"{where}: {len(raw)} bytes is not a whole number of {datatype}")
            return _resolve(np.frombuffer(raw, dtype=dtype).copy(), shape, where)
        if "content" not in value:
            raise InputError(f"{where}: an object value needs 'content' or 'b64'")
        value = value["content"]
    if not isinstance(value, list):
        value = [value]
    flat = _flatten(value)
    if datatype == "BYTES":
        if not all(isinstance(v, str) for v in flat):
            raise InputError(f"{where}: BYTES values must be strings")
        array = np.array([v.encode() for v in flat] + [b""], dtype=np.object_)[:-1]
    elif datatype == "BF16":
        floats = np.asarray(flat, dtype=np.float32)
        array = (floats.view(np.uint32) >> 16).astype(WIRE_DTYPES["BF16"])
    else:
        try:
            array = np.asarray(flat, dtype=WIRE_DTYPES[datatype])
        except (TypeError, ValueError, OverflowError):
            raise InputError(f"{where}: values are not {datatype}") from None
    return _resolve(array, shape, where)


def _flatten(value: list[Any]) -> list[Any]:
    out: list[Any] = []
    stack = [iter(value)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def _resolve(flat: np.ndarray, shape: Sequence[int], where: str) -> np.ndarray:
    """``flat`` reshaped to ``shape``, one unknown (-1) dimension inferred from the count."""
    unknown = [i for i, d in enumerate(shape) if d < 0]
    if len(unknown) > 1:
        raise InputError(f"{where}: shape {list(shape)} has more than one unknown dimension")
    try:
        return flat.reshape(tuple(shape))
    except ValueError:
        raise InputError(
            f"{where}: {flat.size} values do not fit the shape {list(shape)}"
        ) from None
