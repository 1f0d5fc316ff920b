"""What the server asks of NVIDIA GPUs without CUDA, through NVML (``nvidia-ml-py``).

NVML is the driver's management library: it counts devices and reads their memory without
creating a CUDA context. Counting through ``cuInit`` instead leaves the driver initialised in
the worker process, and vLLM, which forks its engine core unless torch says CUDA is
initialised, would hand the child a driver it cannot use. Everything here returns a reason
instead of raising where NVML is absent (no driver, no ``nvidia-ml-py``), so a CPU machine
reads as "no GPU" with a sentence saying why.

The devices are the ones CUDA would show this process: ``CUDA_VISIBLE_DEVICES`` narrows and
orders them (indices, ``GPU-`` UUID prefixes or ``MIG-`` UUIDs, up to the first entry CUDA
would reject). Indices are NVML's, which follow the PCI bus: they match CUDA's own order
under ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, and on a one-GPU pod there is nothing to order.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Final

logger = logging.getLogger(__name__)

VISIBLE_DEVICES_ENV: Final = "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class Device:
    """One GPU (or MIG instance) this process can use."""

    position: int
    """Its CUDA ordinal in this process (``cuda:<position>``)."""
    uuid: str
    handle: Any
    """NVML's device handle, for readings."""


@dataclass(frozen=True)
class GpuCount:
    """How many GPUs this process sees, and why none when there are none."""

    count: int
    reason: str = ""
    """Empty when NVML answered; else why the count is 0."""


def open_nvml() -> tuple[ModuleType | None, str]:
    """The initialised ``pynvml`` module, or None and why NVML cannot be used.

    ``nvmlInit`` is reference counted: pair each success with ``nvmlShutdown`` unless the
    caller keeps NVML for the life of the process.
    """
    try:
        nvml = importlib.import_module("pynvml")
    except ImportError:
        return None, "nvidia-ml-py (pynvml) is not installed"
    try:
        nvml.nvmlInit()
    except Exception as exc:  # pynvml.NVMLError: no library, no driver, driver mismatch
        return None, f"NVML cannot start ({exc})"
    return nvml, ""


def parse_visible_devices(value: str | None) -> tuple[str, ...] | None:
    """``CUDA_VISIBLE_DEVICES`` as CUDA reads it: None (unset) for every device, else the
    entries up to the first one CUDA stops at (empty, negative or not an index or UUID)."""
    if value is None:
        return None
    entries: list[str] = []
    for raw in value.split(","):
        entry = raw.strip()
        if not (entry.isdigit() or entry.startswith(("GPU-", "MIG-"))):
            break
        entries.append(entry)
    return tuple(entries)


def visible_devices(nvml: ModuleType, environ: Mapping[str, str] | None = None) -> list[Device]:
    """The devices CUDA would give this process, in its order; ``nvml`` is initialised.

    Raises ``pynvml.NVMLError`` when NVML cannot list the devices at all; a device whose
    UUID cannot be read (lost, in reset) is left out, with a warning.
    """
    env = os.environ if environ is None else environ
    physical: list[tuple[str, Any] | None] = []
    for index in range(nvml.nvmlDeviceGetCount()):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            physical.append((_text(nvml.nvmlDeviceGetUUID(handle)), handle))
        except Exception as exc:  # pynvml.NVMLError_GpuIsLost and the like
            logger.warning("GPU %d cannot be read through NVML: %s", index, exc)
            physical.append(None)
    entries = parse_visible_devices(env.get(VISIBLE_DEVICES_ENV))
    if entries is None:
        found = [d for d in physical if d is not None]
        return [Device(position, uuid, handle) for position, (uuid, handle) in enumerate(found)]
    devices: list[Device] = []
    for entry in entries:
        picked = _pick(nvml, physical, entry)
        if picked is None or any(d.uuid == picked[0] for d in devices):
            break  # CUDA ignores everything from an unknown or repeated entry on
        devices.append(Device(len(devices), picked[0], picked[1]))
    return devices


def count_gpus(environ: Mapping[str, str] | None = None) -> GpuCount:
    """How many GPUs this process sees, read through NVML (never through CUDA)."""
    nvml, reason = open_nvml()
    if nvml is None:
        return GpuCount(0, reason)
    try:
        devices = visible_devices(nvml, environ)
    except Exception as exc:  # pynvml.NVMLError
        return GpuCount(0, f"NVML cannot list the GPUs ({exc})")
    finally:
        _shutdown(nvml)
    if not devices:
        shown = (environ if environ is not None else os.environ).get(VISIBLE_DEVICES_ENV)
        where = f" ({VISIBLE_DEVICES_ENV}={shown!r})" if shown is not None else ""
        return GpuCount(0, f"NVML reports no usable GPU{where}")
    return GpuCount(len(devices))


def device_memory_total(position: int, environ: Mapping[str, str] | None = None) -> int | None:
    """Total memory in bytes of ``cuda:<position>`` as this process sees it; None where NVML
    cannot tell (logged)."""
    nvml, reason = open_nvml()
    if nvml is None:
        logger.warning("cannot read the memory of cuda:%d: %s", position, reason)
        return None
    try:
        devices = visible_devices(nvml, environ)
        if position >= len(devices):
            logger.warning("cuda:%d is not visible (%d GPUs)", position, len(devices))
            return None
        return int(nvml.nvmlDeviceGetMemoryInfo(devices[position].handle).total)
    except Exception as exc:  # pynvml.NVMLError
        logger.warning("cannot read the memory of cuda:%d: %s", position, exc)
        return None
    finally:
        _shutdown(nvml)


def _pick(
    nvml: ModuleType, physical: list[tuple[str, Any] | None], entry: str
) -> tuple[str, Any] | None:
    if entry.isdigit():
        index = int(entry)
        return physical[index] if index < len(physical) else None
    if entry.startswith("GPU-"):
        matches = [d for d in physical if d is not None and d[0].startswith(entry)]
        return matches[0] if len(matches) == 1 else None
    try:  # a MIG instance: NVML finds it by its full UUID
        return entry, nvml.nvmlDeviceGetHandleByUUID(entry)
    except Exception:  # pynvml.NVMLError_NotFound
        return None


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _shutdown(nvml: ModuleType) -> None:
    try:
        nvml.nvmlShutdown()
    except Exception as exc:  # pynvml.NVMLError
        logger.debug("nvmlShutdown: %s", exc)
