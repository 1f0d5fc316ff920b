"""Which models run their own code in a worker.

A Python-backend model is its ``model.py``, imported into the worker; a PyTorch model
(TorchScript or a ``torch.export`` program) is a program the worker runs. Both are code by
design, with the worker's rights. A standalone server serves them as Triton does; the
control plane registers them only when its operator allows it, and then tells its workers
so with each load (``allow_model_code``), so that a model folder whose files make it one is
refused too, not only a registration that names its backend.
"""

from __future__ import annotations

from typing import Final

from foundation.proto.model_config_pb2 import ModelConfig
from runtimes.base import ModelRuntime
from runtimes.python_model import PythonRuntime
from runtimes.registry import named_runtime_class
from runtimes.torch import TorchRuntime

__all__ = ["CODE_RUNTIMES", "named_code_backend", "runs_model_code"]

CODE_RUNTIMES: Final[tuple[type[ModelRuntime], ...]] = (PythonRuntime, TorchRuntime)
"""Runtimes whose models are code the worker runs."""


def runs_model_code(runtime: type[ModelRuntime]) -> bool:
    """Whether models of ``runtime`` are code the worker runs."""
    return issubclass(runtime, CODE_RUNTIMES)


def named_code_backend(*, backend: str = "", platform: str = "") -> str | None:
    """The backend (a runtime kind) that ``backend`` or ``platform`` names when its models
    are code; None when they name no such runtime (or an unknown one, which a worker
    refuses anyway)."""
    try:
        runtime = named_runtime_class(ModelConfig(backend=backend, platform=platform))
    except ValueError:
        return None
    if runtime is None or not runs_model_code(runtime):
        return None
    return runtime.kind
