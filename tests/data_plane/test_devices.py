"""Counting GPUs without touching CUDA: a real process, with a libcuda it could load."""

from __future__ import annotations

import _struct
import os
import shutil
import subprocess
import sys
from pathlib import Path

_COUNT = """
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
from data_plane.devices import cuda_device_count
count = cuda_device_count()
maps = open("/proc/self/maps").read()
print("count", count)
print("libcuda loaded", "libcuda" in maps)
"""


def test_counting_gpus_never_loads_libcuda(tmp_path: Path):
    """A shared library named libcuda.so.1 on the loader's path (any loadable library will
    do: the point is whether the count opens it), and no NVML driver: 0 GPUs, the reason
    logged, and libcuda absent from the process's mappings."""
    shutil.copy(_struct.__file__, tmp_path / "libcuda.so.1")
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "LD_LIBRARY_PATH": str(tmp_path),
        "PYTHONPATH": str(root),
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)
    result = subprocess.run(
        [sys.executable, "-c", _COUNT], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "count 0" in result.stdout
    assert "libcuda loaded False" in result.stdout
    assert "no GPU for models: " in result.stdout
    assert "NVML" in result.stdout
