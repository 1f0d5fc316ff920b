"""Cold load of a large model: from the load call until the first inference has answered.

For each server the load goes through its own API (it returns once the model is ready),
then one batch-1 JSON request is timed, then the model is unloaded (timed too). The engine
alone builds an ``InferenceSession`` and runs it once in this process. The model file is
read once before the first load, so that every load starts from a warm page cache: the
figures compare the servers' load paths, not the disk. Where a device memory probe is given
(CUDA runs), the device's used memory is read before the load, after it and after unload.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from bench.comparison.contenders import Contender
from bench.engine import Engine
from bench.models import RequestBody
from bench.server import request

MemoryProbe = Callable[[], int | None]
"""Used device memory in bytes, or None where there is no device."""


def warm_page_cache(path: Path) -> float:
    """Read ``path`` once (so later loads find it in the page cache); seconds it took."""
    started = time.monotonic()
    with path.open("rb") as file:
        while file.read(16 * 2**20):
            pass
    return time.monotonic() - started


def served_cold_load(
    contender: Contender,
    model: str,
    body: RequestBody,
    model_bytes: int,
    memory: MemoryProbe | None = None,
) -> dict[str, Any]:
    """Load ``model`` on ``contender``, answer one request, unload; the times (or the error)."""
    port = int(urlsplit(contender.url).port or 80)
    before = memory() if memory else None
    started = time.monotonic()
    try:
        contender.load(model)
    except Exception as exc:
        return {"failed": f"load: {exc}"[:600]}
    loaded = time.monotonic()
    headers = {"Content-Type": body.content_type}
    status, _, answer = request(
        port, "POST", f"/v2/models/{model}/infer", body=body.body, headers=headers, timeout_s=300
    )
    answered = time.monotonic()
    after_load = memory() if memory else None
    record: dict[str, Any] = {
        "load_s": loaded - started,
        "first_infer_s": answered - loaded,
        "load_to_first_answer_s": answered - started,
        "gb_per_s": model_bytes / 1e9 / (answered - started),
    }
    if status != 200:
        record["failed"] = f"first inference answered {status}: {answer[:300]!r}"
    unload_started = time.monotonic()
    try:
        contender.unload(model)
    except Exception as exc:
        record["unload_failed"] = str(exc)[:600]
    record["unload_s"] = time.monotonic() - unload_started
    if memory:
        record["device_memory_bytes"] = {
            "before_load": before,
            "after_load": after_load,
            "after_unload": memory(),
        }
    return record


def engine_cold_load(
    path: Path, row: np.ndarray, model_bytes: int, memory: MemoryProbe | None = None
) -> dict[str, Any]:
    """Build the engine alone's session on ``path`` and run it once, in this process."""
    before = memory() if memory else None
    started = time.monotonic()
    engine = Engine(path)
    loaded = time.monotonic()
    engine.run(row)
    answered = time.monotonic()
    after_load = memory() if memory else None
    del engine
    gc.collect()
    record: dict[str, Any] = {
        "load_s": loaded - started,
        "first_infer_s": answered - loaded,
        "load_to_first_answer_s": answered - started,
        "gb_per_s": model_bytes / 1e9 / (answered - started),
    }
    if memory:
        record["device_memory_bytes"] = {
            "before_load": before,
            "after_load": after_load,
            "after_unload": memory(),
        }
    return record
