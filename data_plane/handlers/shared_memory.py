"""Triton's shared-memory extensions, whatever the transport: the registries one server holds,
and the infer path's reads of inputs from regions and writes of outputs to them.

A transport reaches the registries as ``handlers.shared_memory.system`` and
``handlers.shared_memory.cuda`` (how to call them, and the errors they raise with Triton's
kinds: ``data_plane.shared_memory``). An infer request needs nothing more from a transport
than the inputs' and requested outputs' shared-memory places (``InferInput.shared_memory``,
``RequestedOutput.shared_memory``, ``InferRequest.uses_shared_memory``); the infer handler
calls `SharedMemoryHandlers.place` and the response's outputs written to a region come back
with ``OutputTensor.shared_memory`` set, for the transport to send without data (HTTP: only
name, datatype and shape; gRPC: the same, with an empty ``raw_output_contents`` entry).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Final

import numpy as np
import numpy.typing as npt

from data_plane.errors import request_prefix
from data_plane.protocol import InferRequest, OutputTensor, SharedMemoryRef
from data_plane.protocol.response import bytes_elements, frame_bytes, wire_array
from data_plane.protocol.tensors import byte_size_mismatch, decode_binary
from data_plane.shared_memory import (
    CudaSharedMemory,
    OutputRegionTooSmallError,
    SystemRegion,
    SystemSharedMemory,
)
from foundation.datatypes import ELEMENT_BYTES

_INLINE_BYTES: Final = 1 << 20
"""Copies up to this size run on the event loop; larger ones in a worker thread, so that a
big tensor does not stall every other request. The thread hop costs about 40-45 us of its
own whatever the size, and a read of 1 MiB takes about as long (``python -m
bench.shared_memory_copy`` on the 2-core machine at load 4.9: 4 KiB 2 us inline against
42 us through a thread, 256 KiB 9 against 51, 1 MiB 41 against 106, 4 MiB 200 against
316): below 1 MiB the hop would cost the loop more than the copy it spares it."""


class PlacedOutputs:
    """The regions one request's outputs go to, held until the request is answered."""

    def __init__(self, places: list[tuple[SharedMemoryRef, SystemRegion] | None]) -> None:
        self._places = places

    async def write(self, outputs: Sequence[OutputTensor]) -> None:
        """Write each output that has a place to it, and mark it written (in the order the
        request asked for them). Raises OutputRegionTooSmallError for an output larger than
        its place."""
        if not self._places:  # the request named no outputs, so none has a place
            return
        for output, place in zip(outputs, self._places, strict=True):
            if place is None:
                continue
            ref, region = place
            payload = _wire_bytes(output)
            size = len(payload) if isinstance(payload, bytes) else payload.nbytes
            if size > ref.byte_size:
                raise OutputRegionTooSmallError(
                    output=output.name, given_bytes=ref.byte_size, needed_bytes=size
                )
            if size > _INLINE_BYTES:
                await asyncio.to_thread(region.write, ref.offset, payload)
            else:
                region.write(ref.offset, payload)
            output.shared_memory = ref


class SharedMemoryHandlers:
    """The system and CUDA shared-memory registries of one server, and the infer path's use
    of them."""

    def __init__(self, system: SystemSharedMemory, cuda: CudaSharedMemory) -> None:
        self.system = system
        self.cuda = cuda

    @asynccontextmanager
    async def place(self, request: InferRequest, model: str) -> AsyncIterator[PlacedOutputs]:
        """Read ``request``'s shared-memory inputs into their ``data`` and hold the regions
        its outputs go to; yields what writes those outputs once the model has run.

        Checks every place first, in the request's order (inputs, then outputs), as Triton
        does while parsing: RegionNotFoundError for an unknown region, RegionBoundsError for
        a place outside it; then the inputs' sizes against their shapes (Triton's byte size
        mismatch). The regions stay open until the block ends, even if unregistered
        meanwhile.
        """
        held: list[SystemRegion] = []
        try:
            inputs = [
                (tensor, self._hold(tensor.shared_memory, held))
                for tensor in request.inputs
                if tensor.shared_memory is not None
            ]
            outputs = [
                None
                if o.shared_memory is None
                else (o.shared_memory, self._hold(o.shared_memory, held))
                for o in request.outputs or ()
            ]
            prefix = request_prefix(request.id)
            for tensor, region in inputs:
                ref = tensor.shared_memory
                assert ref is not None
                if tensor.datatype != "BYTES":
                    expected = math.prod(tensor.shape) * ELEMENT_BYTES[tensor.datatype]
                    if ref.byte_size != expected:
                        raise byte_size_mismatch(
                            tensor.name, model, prefix, expected=expected, got=ref.byte_size
                        )
                raw = await _read(region, ref)
                tensor.data = decode_binary(
                    tensor.name, tensor.datatype, tensor.shape, raw.data, model, prefix
                )
            yield PlacedOutputs(outputs)
        finally:
            for region in held:
                region.release()

    def _hold(self, ref: SharedMemoryRef, held: list[SystemRegion]) -> SystemRegion:
        region = self.system.acquire(ref.region)
        held.append(region)
        region.check_window(ref.offset, ref.byte_size)
        return region

    def close(self) -> None:
        """Unregister every region (the server stops)."""
        self.system.close()
        self.cuda.unregister()


async def _read(region: SystemRegion, ref: SharedMemoryRef) -> npt.NDArray[np.uint8]:
    if ref.byte_size > _INLINE_BYTES:
        return await asyncio.to_thread(region.read, ref.offset, ref.byte_size)
    return region.read(ref.offset, ref.byte_size)


def _wire_bytes(output: OutputTensor) -> npt.NDArray[np.generic] | bytes:
    """The output as binary tensor data: what the binary extension would send for it."""
    if output.datatype == "BYTES":
        return frame_bytes(bytes_elements(output.data))
    return wire_array(output.datatype, output.data)
