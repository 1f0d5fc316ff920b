"""``triton_python_backend_utils``' tensors and responses: ``Tensor`` (host memory,
DLPack in and out), ``InferenceResponse`` and ``PreferredMemory``; :mod:`pb_utils`
re-exports them under Triton's names."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import numpy as np

from runtimes.python_backend import tensors
from runtimes.python_backend.pb_config import numpy_to_triton_type
from runtimes.python_backend.pb_errors import TritonError, TritonModelException

_CPU_DEVICE: Final = 1
"""DLPack's device type of host memory."""


class PreferredMemory:
    """Where a BLS request would like its outputs; only host memory is offered."""

    def __init__(self, preferred_memory_type: int, preferred_device_id: int = 0) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


class Tensor:
    """A named tensor of a request or a response, held in host memory."""

    __slots__ = ("_array", "_datatype", "_name")

    def __init__(self, name: str, tensor: Any) -> None:
        array = np.asarray(tensor)
        try:
            datatype = tensors.datatype_of(array)
        except ValueError as exc:
            raise TritonModelException(f"tensor '{name}': {exc}") from None
        if datatype == "BYTES" and array.dtype.kind != "O":
            array = array.astype(np.object_)
        self._name = str(name)
        self._array = array
        self._datatype = datatype

    @classmethod
    def received(cls, name: str, array: np.ndarray, datatype: str) -> Tensor:
        """A tensor read out of the arena: ``array`` is the reader's own copy and
        ``datatype`` its Triton datatype, so the constructor's checks are skipped."""
        tensor = cls.__new__(cls)
        tensor._name = name
        tensor._array = array
        tensor._datatype = datatype
        return tensor

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        """The data as a numpy array (BYTES as an object array of ``bytes``)."""
        return self._array

    def triton_dtype(self) -> int:
        """The TRITONSERVER_DataType number (TYPE_FP32 is 11, BYTES 13)."""
        number = numpy_to_triton_type(self._array.dtype.type)
        return int(number) if number is not None else 0

    def shape(self) -> list[int]:
        return [int(d) for d in self._array.shape]

    def is_cpu(self) -> bool:
        """Always True: tensors cross to and from the server in host shared memory."""
        return True

    def to_dlpack(self) -> Any:
        """A DLPack capsule of the data (``torch.from_dlpack`` takes it)."""
        return self._array.__dlpack__()

    def __dlpack__(self, stream: Any = None) -> Any:
        return self._array.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_CPU_DEVICE, 0)

    @staticmethod
    def from_dlpack(name: str, dlpack_tensor: Any) -> Tensor:
        """A tensor from a DLPack capsule or an object with ``__dlpack__`` (a torch
        tensor); device tensors are copied to host memory, which needs torch."""
        device = getattr(dlpack_tensor, "__dlpack_device__", None)
        if device is not None and device()[0] == _CPU_DEVICE:
            return Tensor(name, np.from_dlpack(dlpack_tensor))
        try:
            import torch
            import torch.utils.dlpack
        except ImportError:
            raise TritonModelException(
                "Tensor.from_dlpack of a capsule or a device tensor needs torch"
            ) from None
        host = torch.utils.dlpack.from_dlpack(dlpack_tensor).cpu()
        return Tensor(name, host.numpy())

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, {self._datatype}, {self.shape()})"


class InferenceResponse:
    """One request's answer: output tensors, or an error."""

    def __init__(
        self, output_tensors: Sequence[Tensor] = (), error: TritonError | None = None
    ) -> None:
        outputs = list(output_tensors)
        for tensor in outputs:
            if not isinstance(tensor, Tensor):
                raise TypeError(
                    f"InferenceResponse output_tensors must be pb_utils.Tensor objects, "
                    f"found type '{type(tensor)}'"
                )
        if error is not None and not isinstance(error, TritonError):
            raise TypeError(f"InferenceResponse error must be a TritonError, found {type(error)}")
        self._outputs = outputs
        self._error = error
        self.is_last = True
        """The last response of its request (a decoupled BLS call's iterator ends there)."""
        self._parameters = "{}"

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        """The response's parameters as a JSON object text."""
        return self._parameters


def datatype_of(tensor: Tensor) -> str:
    """The Triton datatype ``tensor`` was built with (the stub writes it without asking
    numpy again)."""
    return tensor._datatype
