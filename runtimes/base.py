"""The one interface every inference engine implements."""

from __future__ import annotations

import abc
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from data_plane.proto.model_config_pb2 import ModelConfig


class RuntimeState(enum.Enum):
    """Where a runtime is in its life; only READY serves."""

    NEW = "NEW"
    LOADING = "LOADING"
    READY = "READY"
    SLEEPING = "SLEEPING"
    UNLOADING = "UNLOADING"
    UNLOADED = "UNLOADED"
    FAILED = "FAILED"


@dataclass(frozen=True)
class RuntimeCapabilities:
    """What a runtime kind can do beyond load/infer/unload."""

    can_sleep: bool = False
    """Offers a sleeping state (weights off the device, caches freed) between loaded and not."""


@dataclass(frozen=True)
class RuntimeOptions:
    """Node-level knobs a runtime takes from the server's settings, not from the model."""

    cache_dir: Path | None = None
    """Folder for engine caches (ONNX Runtime optimized models, TensorRT engines)."""
    intra_op_threads: int = 0
    """Threads an engine may use inside one operator; 0 lets the engine choose."""
    inter_op_threads: int = 0
    """Threads an engine may use across operators; 0 lets the engine choose."""


class ModelRuntime(abc.ABC):
    """One loaded model version on one device.

    The server builds a runtime per model version, calls :meth:`load` once, then
    :meth:`infer` from the batcher (concurrently, up to the model's instance count), and
    :meth:`unload` once no request is in flight. Implementations run blocking engine work
    in an executor they own (named after the model), never on the event loop.
    """

    kind: ClassVar[str]
    """The config ``backend`` this runtime serves (``onnxruntime``, ``pytorch``, ``python``)."""
    model_filename: ClassVar[str]
    """The default file name inside a version folder (``model.onnx``, ...)."""
    capabilities: ClassVar[RuntimeCapabilities] = RuntimeCapabilities()

    def __init__(self, *, name: str, version: int, options: RuntimeOptions) -> None:
        self.name = name
        self.version = version
        self.options = options
        self.state = RuntimeState.NEW

    @classmethod
    def complete_config(cls, version_dir: Path, config: ModelConfig) -> None:
        """Fill ``config`` fields the model file can answer (inputs, outputs, batching).

        Called before :meth:`load`, off the event loop, with ``version_dir`` the folder of
        the version to be loaded. Fields the user set are never overwritten. The default
        does nothing; runtimes whose files describe themselves (ONNX) override it.
        """
        return None

    @abc.abstractmethod
    async def load(self, model_dir: Path, config: ModelConfig, device: str) -> None:
        """Build the engine from ``model_dir`` (a version folder) on ``device``.

        ``device`` is ``"cpu"`` or ``"cuda:N"``. ``config`` is complete and normalized;
        ``instance_group[0].count`` says how many :meth:`infer` calls may run at once.
        Sets ``state`` to READY on success; raises (leaving nothing allocated) on failure.
        """

    @abc.abstractmethod
    async def infer(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch: named inputs in, every configured output out.

        Inputs have the config's datatypes (BYTES as object arrays of ``bytes``, BF16 as
        float32) and, for batching models, the batch on dim 0. Outputs keep dim 0 equal
        to the inputs' batch size. Safe to call concurrently up to the instance count.
        """

    @abc.abstractmethod
    async def unload(self) -> None:
        """Release everything :meth:`load` took: the engine, host memory, device memory.

        Called once, after the last in-flight :meth:`infer` returned. On CUDA the device
        memory returns to its level before the load (allocator caches emptied). Idempotent.
        """

    async def sleep(self) -> None:
        """Move weights off the device and free caches; only where ``capabilities.can_sleep``."""
        raise NotImplementedError(f"{self.kind} runtime cannot sleep")

    async def wake(self) -> None:
        """Undo :meth:`sleep`; only where ``capabilities.can_sleep``."""
        raise NotImplementedError(f"{self.kind} runtime cannot sleep")


def instance_count(config: ModelConfig) -> int:
    """How many executions of one model version may run at once (Triton's instance count)."""
    return max(1, sum(max(group.count, 1) for group in config.instance_group))
