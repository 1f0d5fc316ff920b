"""Triton's shared-memory parameters of an input or requested output: where its tensor lives.

An input or requested output whose ``parameters`` hold ``shared_memory_region`` has its data
in that registered region, ``shared_memory_byte_size`` bytes from ``shared_memory_offset``
(both default to 0, which the region's bounds check then refuses for the size). The request
carries no data for it; the infer handler reads inputs from and writes outputs to the region.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from data_plane.protocol.json_data import NOT_STRING, NOT_UINT
from data_plane.shared_memory.errors import SharedMemoryRequestError

REGION_PARAMETER: Final = "shared_memory_region"
"""The parameter naming a tensor's region; its presence means the tensor is in shared memory."""
_UINT64_MAX: Final = 2**64 - 1


@dataclass(frozen=True, slots=True)
class SharedMemoryRef:
    """A tensor's place: ``byte_size`` bytes from ``offset`` in the region named ``region``."""

    region: str
    offset: int
    byte_size: int


def shared_memory_ref(parameters: Mapping[str, object]) -> SharedMemoryRef:
    """The place ``parameters`` (holding `REGION_PARAMETER`) give, as plain values: a string
    region, unsigned integer offset and byte size (a gRPC adapter passes its parameters'
    values). Wrong types raise SharedMemoryRequestError with Triton's texts."""
    region = parameters[REGION_PARAMETER]
    if not isinstance(region, str):
        raise SharedMemoryRequestError(f"Unable to parse '{REGION_PARAMETER}': {NOT_STRING}")
    offset = _uint(parameters, "shared_memory_offset")
    byte_size = _uint(parameters, "shared_memory_byte_size")
    return SharedMemoryRef(region, offset, byte_size)


def _uint(parameters: Mapping[str, object], name: str) -> int:
    value = parameters.get(name, 0)
    if type(value) is not int or not 0 <= value <= _UINT64_MAX:
        raise SharedMemoryRequestError(f"Unable to parse '{name}': {NOT_UINT}")
    return value
