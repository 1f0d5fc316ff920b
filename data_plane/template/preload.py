"""What the template does once, before its first fork: the imports every worker would run,
and the facts a worker would otherwise find out at start (GPUs, libc)."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import importlib
import os
import select
import signal
import sys
from collections.abc import Iterable
from typing import Final

__all__ = ["PRELOADED", "count_gpus", "load_libc", "preload"]

PRELOADED: Final = (
    # The data plane as a worker runs it, which imports ONNX Runtime, numpy, gRPC and
    # uvicorn; then what its start-up imports lazily (measured: the modules a worker adds
    # between its imports and answering its first liveness probe).
    "data_plane.server",
    "data_plane.template.child",
    "onnxruntime",
    "numpy",
    "grpc",
    "grpc.aio",
    "uvloop",
    "uvicorn.lifespan.on",
    "uvicorn.protocols.http.auto",
    "uvicorn.protocols.websockets.auto",
    "encodings.idna",
    # A model from S3 or the node cache: the storage client, imported at its first use.
    "boto3",
    "boto3.session",
)
_OPTIONAL: Final = ("pynvml",)
"""Imported where installed: NVML's gauges (the worker initialises NVML itself)."""
_GPU_PROBE_TIMEOUT_S: Final = 30.0


def preload(extra: Iterable[str] = ()) -> None:
    """Import what every worker needs, and ``extra`` (e.g. ``torch`` for a pool of torch
    models; importing torch does not initialise CUDA, which happens on first use)."""
    for name in (*PRELOADED, *extra):
        importlib.import_module(name)
    for name in _OPTIONAL:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


def load_libc() -> ctypes.CDLL | None:
    """libc, for ``prctl`` in the children (Linux); None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name, use_errno=True) if name is not None else None


def count_gpus() -> int | None:
    """GPUs the worker would count (`data_plane.devices`), counted in a forked child that
    then exits: counting opens NVML, a driver handle the template keeps out of the state
    its children copy. None when the child gave no answer in time (each worker then
    counts for itself)."""
    from data_plane.devices import cuda_device_count

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read_end)
            os.write(write_end, str(cuda_device_count()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        poller = select.poll()
        poller.register(read_end, select.POLLIN)
        answer = b""
        if poller.poll(_GPU_PROBE_TIMEOUT_S * 1000):
            answer = os.read(read_end, 64)
        return int(answer) if answer.isdigit() else None
    finally:
        os.close(read_end)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
