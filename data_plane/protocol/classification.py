"""Triton's classification extension: an output's top entries as ``value:index:label`` BYTES."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from data_plane.errors import InvalidArgumentError
from foundation.datatypes import protocol_from_numpy

_MAX_CLASSIFICATION_ELEMENTS: Final = 1_000_000
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
