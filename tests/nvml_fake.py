"""A stand-in for ``pynvml`` (nvidia-ml-py): NVML needs an NVIDIA driver, which this machine
and CI lack. Tests that use it say so."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import ModuleType, SimpleNamespace
from typing import Any


class NVMLError(Exception):
    """pynvml's error root."""


class NVMLErrorNotSupported(NVMLError):
    pass


class NVMLErrorGpuIsLost(NVMLError):
    pass


class NVMLErrorNotFound(NVMLError):
    pass


def fake_nvml(
    uuids: tuple[str, ...] = ("GPU-1234",),
    failing: Mapping[tuple[int, str], type[NVMLError]] | None = None,
    mig: tuple[str, ...] = (),
) -> ModuleType:
    """A pynvml with a GPU per UUID (total memory 80 bytes, used 20 + index); ``failing``
    maps (index, function name) to the error that function raises for that GPU; ``mig``
    are the MIG instances' UUIDs ``nvmlDeviceGetHandleByUUID`` finds."""
    fails = failing or {}

    def reading(name: str, value: Callable[[int], Any]) -> Callable[[int], Any]:
        def read(handle: int) -> Any:
            error = fails.get((handle, name))
            if error is not None:
                raise error(name)
            return value(handle)

        return read

    module = ModuleType("pynvml")
    module.NVMLError = NVMLError  # type: ignore[attr-defined]
    module.nvmlInit = lambda: None  # type: ignore[attr-defined]
    module.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    module.nvmlDeviceGetCount = lambda: len(uuids)  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    module.nvmlDeviceGetUUID = reading("nvmlDeviceGetUUID", lambda h: uuids[h].encode())  # type: ignore[attr-defined]
    module.nvmlDeviceGetMemoryInfo = reading(  # type: ignore[attr-defined]
        "nvmlDeviceGetMemoryInfo", lambda h: SimpleNamespace(total=80, used=20 + h)
    )
    module.nvmlDeviceGetUtilizationRates = reading(  # type: ignore[attr-defined]
        "nvmlDeviceGetUtilizationRates", lambda h: SimpleNamespace(gpu=50)
    )
    module.nvmlDeviceGetPowerUsage = reading("nvmlDeviceGetPowerUsage", lambda h: 150_000)  # type: ignore[attr-defined]
    module.nvmlDeviceGetEnforcedPowerLimit = reading(  # type: ignore[attr-defined]
        "nvmlDeviceGetEnforcedPowerLimit", lambda h: 700_000
    )

    def by_uuid(uuid: bytes | str) -> str:
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        if text not in mig:
            raise NVMLErrorNotFound(text)
        return text

    module.nvmlDeviceGetHandleByUUID = by_uuid  # type: ignore[attr-defined]
    return module
