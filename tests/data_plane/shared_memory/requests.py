"""Infer request entries placing tensors in shared memory, as clients write them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def shm_input(
    name: str,
    region: object,
    offset: int | None,
    byte_size: int | None,
    *,
    shape: Sequence[int] = (1, 16),
    datatype: str = "INT32",
) -> dict[str, Any]:
    """An ``inputs`` entry whose data is in ``region`` (None leaves a parameter out)."""
    return {
        "name": name,
        "datatype": datatype,
        "shape": list(shape),
        "parameters": _place(region, offset, byte_size),
    }


def shm_output(
    name: str, region: object, offset: object = None, byte_size: object = None, **extra: Any
) -> dict[str, Any]:
    """An ``outputs`` entry to be written to ``region`` (None leaves a parameter out)."""
    return {"name": name, "parameters": {**_place(region, offset, byte_size), **extra}}


def _place(region: object, offset: object, byte_size: object) -> dict[str, Any]:
    parameters: dict[str, Any] = {"shared_memory_region": region}
    if offset is not None:
        parameters["shared_memory_offset"] = offset
    if byte_size is not None:
        parameters["shared_memory_byte_size"] = byte_size
    return parameters
