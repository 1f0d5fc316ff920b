"""One traced request: what it recorded, and its entries in Triton's trace JSON.

A trace file is one JSON array of entries, several per request, each carrying the trace's
``id``: ``{"id", "model_name", "model_version"[, "request_id"]}``, then one
``{"id", "timestamps": [{"name", "ns"}]}`` per point in time and, at level TENSORS, one
``{"id", "activity", "tensor": {"name", "data", "shape", "dtype"}}`` per tensor. Times are
``CLOCK_MONOTONIC`` nanoseconds (``time.monotonic_ns``), the clock Triton's
``steady_clock`` reads on Linux.

Records keep references to the tensors and are encoded by the trace writer off the event
loop; the arrays must not change afterwards (request inputs and engine outputs do not).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

REQUEST_START = "REQUEST_START"
QUEUE_START = "QUEUE_START"
COMPUTE_START = "COMPUTE_START"
COMPUTE_INPUT_END = "COMPUTE_INPUT_END"
COMPUTE_OUTPUT_START = "COMPUTE_OUTPUT_START"
COMPUTE_END = "COMPUTE_END"
REQUEST_END = "REQUEST_END"

TENSOR_QUEUE_INPUT = "TENSOR_QUEUE_INPUT"
TENSOR_BACKEND_OUTPUT = "TENSOR_BACKEND_OUTPUT"


@dataclass(frozen=True, slots=True)
class TracedTensor:
    """A tensor a trace records at level TENSORS."""

    activity: str
    name: str
    datatype: str
    data: np.ndarray


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """Everything one traced request recorded, in the order it is written."""

    id: int
    model_name: str
    model_version: int
    request_id: str | None
    timestamps: tuple[tuple[str, int], ...]
    """``(name, ns)`` in time order; empty unless the level has TIMESTAMPS."""
    tensors: tuple[TracedTensor, ...]
    """Empty unless the level has TENSORS."""

    def entries(self) -> Iterator[dict[str, Any]]:
        """The record's trace-file entries, as Triton orders them: the request's identity
        (with timestamps only, as Triton writes it with REQUEST_START), its timestamps up to
        QUEUE_START, the queued inputs, the rest of the timestamps with the outputs before
        COMPUTE_END."""
        if self.timestamps:
            head: dict[str, Any] = {
                "id": self.id,
                "model_name": self.model_name,
                "model_version": self.model_version,
            }
            if self.request_id:
                head["request_id"] = self.request_id
            yield head
        inputs = [t for t in self.tensors if t.activity == TENSOR_QUEUE_INPUT]
        outputs = [t for t in self.tensors if t.activity != TENSOR_QUEUE_INPUT]
        for name, ns in self.timestamps:
            if name == COMPUTE_END:
                yield from (_tensor_entry(self.id, t) for t in outputs)
                outputs = []
            yield {"id": self.id, "timestamps": [{"name": name, "ns": ns}]}
            if name == QUEUE_START:
                yield from (_tensor_entry(self.id, t) for t in inputs)
                inputs = []
        yield from (_tensor_entry(self.id, t) for t in (*inputs, *outputs))


def encode_entries(records: list[TraceRecord]) -> bytes:
    """The records' entries, comma separated, without the array's brackets."""
    return b",".join(orjson.dumps(entry) for record in records for entry in record.entries())


def _tensor_entry(trace_id: int, tensor: TracedTensor) -> dict[str, Any]:
    return {
        "id": trace_id,
        "activity": tensor.activity,
        "tensor": {
            "name": tensor.name,
            "data": _data_text(tensor.data, tensor.datatype),
            "shape": ",".join(str(d) for d in tensor.data.shape),
            "dtype": tensor.datatype,
        },
    }


def _data_text(data: np.ndarray, datatype: str) -> str:
    """Elements comma separated as Triton prints them: floats with six significant digits
    (C++ streams' default), booleans as 1/0, strings quoted; FP16 and BF16 left empty, as
    Triton leaves them. Triton prints INT8/UINT8 as characters; numbers are written here,
    which keeps the file valid JSON."""
    if datatype in ("FP16", "BF16"):
        return ""
    flat = data.reshape(-1)
    if datatype == "BYTES":
        return ",".join(
            '"' + (v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)) + '"'
            for v in flat
        )
    if datatype == "BOOL":
        return ",".join("1" if v else "0" for v in flat.tolist())
    if datatype in ("FP32", "FP64"):
        return ",".join(f"{v:g}" for v in flat.tolist())
    return ",".join(str(v) for v in flat.tolist())
