"""What accelerators this process can use, found without importing a framework."""

from __future__ import annotations

import ctypes
import ctypes.util


def cuda_device_count() -> int:
    """Number of CUDA devices the driver reports; 0 where there is no driver or no GPU.

    Asks libcuda directly: importing torch just to count GPUs costs seconds at start.
    """
    name = ctypes.util.find_library("cuda") or "libcuda.so.1"
    try:
        lib = ctypes.CDLL(name)
    except OSError:
        return 0
    count = ctypes.c_int(0)
    try:
        if lib.cuInit(0) != 0 or lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return 0
    except AttributeError:
        return 0
    return count.value
