"""``--shared-memory system``: the run's inputs and outputs in POSIX shared memory.

Before the clock starts the run writes every distinct request's input tensors into one
object under ``/dev/shm`` and sets aside a second object for outputs, one window per *slot*
(a connection, or a gRPC call in flight: whatever carries one request at a time), so that
no two requests in flight write their answers over each other. Both objects are registered
with the server as Triton system shared-memory regions (over HTTP or gRPC, through a
:class:`Registrar`), the request bytes name them (Triton's ``shared_memory_region``,
``shared_memory_offset`` and ``shared_memory_byte_size`` parameters) instead of carrying
tensor data, and at the end, whatever happened, the regions are unregistered and the
objects removed (:class:`SharedMemoryRun`).

The outputs share one region, each slot at its own offset, rather than a region per slot:
the same isolation with two registrations, where a region per slot would hold a descriptor
open in the server for each of up to ``--max-connections`` slots.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final, Protocol, Self

from zeroserve.bench.inputs import WIRE_DTYPES, Tensor, TensorSpec

logger = logging.getLogger(__name__)

SHM_ROOT: Final = Path("/dev/shm")
ALIGN: Final = 64
"""Each tensor starts on a cache-line boundary."""


class SharedMemoryError(Exception):
    """The regions cannot be made or registered: the message says why, for the user."""


class Registrar(Protocol):
    """Registers and unregisters system shared-memory regions with the server under test."""

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Raises :class:`SharedMemoryError` with the server's answer when refused."""

    def unregister(self, name: str) -> None:
        """Raises :class:`SharedMemoryError` when the server cannot be told."""


@dataclass(frozen=True)
class Placement:
    """Where one tensor lies: a registered region, and its window in it."""

    region: str
    offset: int
    byte_size: int


@dataclass(frozen=True)
class PlacedInput:
    """An input of a request whose data is in shared memory."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    place: Placement


@dataclass(frozen=True)
class PlacedOutput:
    """A requested output to be written into shared memory."""

    name: str
    place: Placement


def output_sizes(
    outputs: Sequence[TensorSpec], *, batch_size: int, is_batched: bool, fallback: int
) -> list[int]:
    """Bytes to set aside for each output of one request: its size where the metadata fixes
    it, ``fallback`` for BYTES or variable dimensions."""
    sizes = []
    for spec in outputs:
        dims = (batch_size, *spec.shape[1:]) if is_batched else spec.shape
        if spec.datatype == "BYTES" or any(d < 0 for d in dims):
            sizes.append(fallback)
            continue
        count = 1
        for d in dims:
            count *= d
        sizes.append(max(count * WIRE_DTYPES[spec.datatype].itemsize, 1))
    return sizes


def _aligned(size: int) -> int:
    return (size + ALIGN - 1) // ALIGN * ALIGN


class ShmObject:
    """A POSIX shared-memory object this process created (``/dev/shm/<name>``), removed by
    :meth:`remove`."""

    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self.size = size
        self.path = SHM_ROOT / name
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise SharedMemoryError(f"cannot create {self.path}: {exc.strerror}") from None
        try:
            os.ftruncate(self._fd, size)
        except OSError as exc:
            self.remove()
            raise SharedMemoryError(f"cannot size {self.path} to {size} bytes: {exc}") from None

    @property
    def key(self) -> str:
        """The key a client gives Triton (``shm_open``'s name)."""
        return f"/{self.name}"

    def write(self, offset: int, data: bytes) -> None:
        os.pwrite(self._fd, data, offset)

    def read(self, offset: int, size: int) -> bytes:
        return os.pread(self._fd, size, offset)

    def remove(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self.path.unlink(missing_ok=True)


@dataclass(frozen=True)
class Layout:
    """What the request builders need: each request's placed inputs and each slot's
    placed outputs."""

    inputs: list[list[PlacedInput]]
    """Per distinct request, its inputs in order."""
    outputs: list[list[PlacedOutput]]
    """Per slot, every output of the model in its window."""


class SharedMemoryRun:
    """The regions of one run: made and registered on entry, unregistered and removed on
    exit (also when the run failed or was interrupted)."""

    def __init__(
        self,
        registrar: Registrar,
        requests: Sequence[Sequence[Tensor]],
        outputs: Sequence[TensorSpec],
        output_bytes: Sequence[int],
        slots: int,
    ) -> None:
        if not SHM_ROOT.is_dir():
            raise SharedMemoryError(f"system shared memory needs {SHM_ROOT}, which is missing")
        self._registrar = registrar
        self._requests = [list(r) for r in requests]
        self._outputs = list(outputs)
        self._output_bytes = [_aligned(size) for size in output_bytes]
        self._slots = slots
        token = f"zsbench_{os.getpid()}_{secrets.token_hex(4)}"
        self.input_region = f"{token}_input"
        self.output_region = f"{token}_output"
        self._objects: list[ShmObject] = []
        self._registered: list[str] = []
        self.layout = Layout([], [])
        self.input_object: ShmObject | None = None
        self.output_object: ShmObject | None = None

    def __enter__(self) -> Self:
        try:
            self.layout = self._make()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _make(self) -> Layout:
        datas = [[t.raw_bytes() for t in request] for request in self._requests]
        input_size = sum(_aligned(len(d)) for request in datas for d in request)
        inputs_object = self._object(self.input_region, max(input_size, ALIGN))
        self.input_object = inputs_object
        placed_inputs: list[list[PlacedInput]] = []
        offset = 0
        for request, request_datas in zip(self._requests, datas, strict=True):
            placed = []
            for tensor, data in zip(request, request_datas, strict=True):
                inputs_object.write(offset, data)
                place = Placement(self.input_region, offset, len(data))
                placed.append(PlacedInput(tensor.name, tensor.datatype, tensor.shape, place))
                offset += _aligned(len(data))
            placed_inputs.append(placed)
        window = sum(self._output_bytes)
        output_object = self._object(self.output_region, max(window * self._slots, ALIGN))
        self.output_object = output_object
        placed_outputs = []
        for slot in range(self._slots):
            offset = slot * window
            slot_outputs = []
            for spec, size in zip(self._outputs, self._output_bytes, strict=True):
                slot_outputs.append(
                    PlacedOutput(spec.name, Placement(self.output_region, offset, size))
                )
                offset += size
            placed_outputs.append(slot_outputs)
        for shm in self._objects:
            self._registrar.register(shm.name, shm.key, 0, shm.size)
            self._registered.append(shm.name)
        return Layout(placed_inputs, placed_outputs)

    def _object(self, name: str, size: int) -> ShmObject:
        shm = ShmObject(name, size)
        self._objects.append(shm)
        return shm

    def close(self) -> None:
        """Unregister what was registered, then remove the objects; a failure to unregister
        is logged, not raised, so that the objects are removed all the same."""
        while self._registered:
            name = self._registered.pop()
            try:
                self._registrar.unregister(name)
            except SharedMemoryError as exc:
                logger.warning("could not unregister shared-memory region %s: %s", name, exc)
        while self._objects:
            self._objects.pop().remove()
