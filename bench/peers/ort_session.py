"""One ONNX Runtime session with the options every server in the comparison uses.

The same as ``runtimes/onnx/builder.py`` and ``bench/engine.py``: a fresh ``SessionOptions`` with
``intra_op_num_threads`` and ``inter_op_num_threads`` from the environment where the
benchmark sets them (non-zero), else as ``runtimes.onnx.threads.choose_threads`` decides for
one instance: one thread and no spinning for a model under 32 MiB of weights, ONNX Runtime's
pool (one thread per core) spinning from there (this file runs in the peers' own
environments, without zeroserve, so the rule is repeated here); and the CPU provider (or CUDA
with ``ZEROSERVE_PEER_DEVICE=cuda``).
The benchmark passes its settings through ``ZEROSERVE_PEER_*`` variables.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

SMALL_MODEL_MAX_BYTES = 32 * 2**20
"""As ``runtimes.onnx.threads.SMALL_MODEL_MAX_BYTES``."""


def open_session(path: str | Path) -> Any:
    """An ``InferenceSession`` on ``path`` set up as the benchmark asks."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    is_small = Path(path).stat().st_size < SMALL_MODEL_MAX_BYTES
    threads = int(os.environ.get("ZEROSERVE_PEER_INTRA_OP_THREADS", "0")) or (1 if is_small else 0)
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = int(os.environ.get("ZEROSERVE_PEER_INTER_OP_THREADS", "0"))
    spinning = "0" if is_small or threads == 1 else "1"
    options.add_session_config_entry("session.intra_op.allow_spinning", spinning)
    options.add_session_config_entry("session.inter_op.allow_spinning", spinning)
    if os.environ.get("ZEROSERVE_PEER_DEVICE", "cpu") == "cuda":
        providers = ["CUDAExecutionProvider"]
    else:
        providers = ["CPUExecutionProvider"]
    return ort.InferenceSession(str(path), sess_options=options, providers=providers)


_DATATYPES = {
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(float16)": "FP16",
    "tensor(int64)": "INT64",
    "tensor(int32)": "INT32",
    "tensor(int8)": "INT8",
    "tensor(uint8)": "UINT8",
    "tensor(bool)": "BOOL",
    "tensor(string)": "BYTES",
}


def tensor_metadata(arguments: list[Any]) -> list[dict[str, Any]]:
    """V2 metadata (name, datatype, shape with -1 for symbolic dimensions) of a session's
    ``get_inputs()`` or ``get_outputs()``."""
    return [
        {
            "name": a.name,
            "datatype": _DATATYPES.get(a.type, a.type),
            "shape": [d if isinstance(d, int) else -1 for d in a.shape],
        }
        for a in arguments
    ]
