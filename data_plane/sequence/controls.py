"""The control tensors the sequence batcher adds to a model's requests.

As Triton sets them (``SequenceBatch::SetControlTensors``): START is true on a request with
the START flag, END on one with the END flag, READY on every real request and false on the
filler rows of a direct batch (whose CORRID is 0). Each boolean control takes the config's
false/true values in its own form (``int32_false_true``, ``fp32_false_true``,
``bool_false_true``). Each tensor has one element per row: shape ``[rows, 1]`` for a batching
model, ``[1]`` for one that does not batch.

CORRID carries the request's correlation ID: a uint64 ID as the low bytes of its little-endian
value (INT64 reads the same 8 bytes, UINT32/INT32 the low 4), a string ID as Triton writes it
into a numeric tensor (its uint32 length, then its bytes, cut to the element's size). A
TYPE_STRING CORRID gets the string itself (a uint64 ID as its decimal text): Triton 2.51
writes a malformed string tensor there, which its backends refuse.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

from data_plane.sequence.table import END, START, CorrelationId
from foundation.datatypes import NUMPY_DTYPES
from foundation.sequence_config import CORRID, END as END_KIND, READY, START as START_KIND, Control

Row = tuple[int, CorrelationId] | None
"""One row's flags and correlation ID, or None for a filler row (not ready)."""


class ControlTensors:
    """Builds a model's control inputs for a batch's rows.

    Parameters:
        controls: the config's control tensors (``foundation.sequence_config.controls``).
        batching: the model batches (``max_batch_size`` > 0): each tensor gets a batch dim.
    """

    def __init__(self, controls: Sequence[Control], *, batching: bool) -> None:
        self._controls = tuple(controls)
        self._batching = batching
        self._corrid = tuple(c for c in self._controls if c.kind == CORRID)
        self._by_flags: dict[int, dict[str, np.ndarray]] = {}

    def for_request(self, flags: int, correlation_id: CorrelationId) -> dict[str, np.ndarray]:
        """The control tensors of one real request (one row). The boolean ones depend on
        the flags alone and are made once per flags value, read-only (an engine must not
        write its inputs)."""
        key = flags & (START | END)
        shared = self._by_flags.get(key)
        if shared is None:
            corrid = {c.name for c in self._corrid}
            shared = {n: t for n, t in self.for_rows([(key, 0)]).items() if n not in corrid}
            for tensor in shared.values():
                tensor.flags.writeable = False
            self._by_flags[key] = shared
        if not self._corrid:
            return shared
        tensors = dict(shared)
        shape = (1, 1) if self._batching else (1,)
        for control in self._corrid:
            value = _corrid(control.datatype, correlation_id)
            dtype = NUMPY_DTYPES[control.datatype]
            tensors[control.name] = np.array([value], dtype=dtype).reshape(shape)
        return tensors

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self._controls)

    def for_rows(self, rows: Sequence[Row]) -> dict[str, np.ndarray]:
        """Every control tensor for ``rows``, in order (one row when the model does not
        batch)."""
        tensors: dict[str, np.ndarray] = {}
        shape = (len(rows), 1) if self._batching else (len(rows),)
        for control in self._controls:
            dtype = NUMPY_DTYPES[control.datatype]
            if control.kind == CORRID:
                values = [_corrid(control.datatype, None if r is None else r[1]) for r in rows]
                tensors[control.name] = np.array(values, dtype=dtype).reshape(shape)
                continue
            flags = [_is_true(control.kind, row) for row in rows]
            values_ft = [control.true_value if f else control.false_value for f in flags]
            tensors[control.name] = np.array(values_ft, dtype=dtype).reshape(shape)
        return tensors


def _is_true(kind: str, row: Row) -> bool:
    if row is None:
        return False
    if kind == READY:
        return True
    if kind == START_KIND:
        return bool(row[0] & START)
    if kind == END_KIND:
        return bool(row[0] & END)
    raise ValueError(f"not a boolean control kind: {kind}")


def _corrid(datatype: str, correlation_id: CorrelationId | None) -> object:
    if datatype == "BYTES":
        if correlation_id is None:
            return b""
        return str(correlation_id).encode()
    dtype = NUMPY_DTYPES[datatype]
    if correlation_id is None:
        return 0
    if isinstance(correlation_id, int):
        raw = struct.pack("<Q", correlation_id)
    else:
        encoded = correlation_id.encode()
        raw = (struct.pack("<I", len(encoded)) + encoded).ljust(8, b"\0")
    return np.frombuffer(raw[: dtype.itemsize], dtype=dtype.newbyteorder("<"))[0]
