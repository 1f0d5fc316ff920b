"""The one interface every inference engine implements."""

from __future__ import annotations

import abc
import asyncio
import enum
import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from foundation import model_config
from foundation.proto.model_config_pb2 import ModelConfig
from runtimes.capabilities import Capabilities
from runtimes.custom_metrics import CustomMetrics
from runtimes.errors import ModelLoadError
from runtimes.model_request import ModelCaller

logger = logging.getLogger(__name__)


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
    drain_timeout_s: float = 30.0
    """How long :meth:`ModelRuntime.sleep` lets requests in flight finish before aborting them."""
    models: ModelCaller | None = None
    """The server's other models, for runtimes whose models call them (Triton's BLS);
    None where the server offers no such calls."""
    custom_metrics: CustomMetrics | None = None
    """Where models' own metrics go (Triton's ``pb_utils.MetricFamily``), shown on the
    server's ``/metrics``; None where the server keeps none (models creating one fail)."""


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
    default_cpu_instances: ClassVar[int] = 1
    """Instances of a ``KIND_CPU`` group whose configuration leaves the count out (Triton's
    backends opt into more one by one)."""
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

    def resolve_capabilities(self) -> Capabilities:
        """What this runtime offers beyond load, infer and unload, each as a typed object
        (None where absent). Asked once, after a successful :meth:`load`; the answer holds
        for the runtime's life. The default offers sleep where ``capabilities.can_sleep``."""
        return Capabilities(sleep=self if self.capabilities.can_sleep else None)


class ExecutorRuntime(ModelRuntime):
    """A runtime whose engine calls run in an executor it owns (set in :meth:`load`).

    :meth:`unload` takes the executor away, lets the calls in it finish, then frees the
    engine in a thread, so no engine call ever overlaps the release.
    """

    engine_label: ClassVar[str]
    """How log lines name this kind of model (``ONNX``, ``PyTorch``, ``Python``)."""

    def __init__(self, *, name: str, version: int, options: RuntimeOptions) -> None:
        super().__init__(name=name, version=version, options=options)
        self._executor: ThreadPoolExecutor | None = None

    async def unload(self) -> None:
        """Drain the executor, then free the engine (see :meth:`_free_engine`); idempotent."""
        executor, self._executor = self._executor, None
        if executor is None:
            self._forget_engine()
            self.state = RuntimeState.UNLOADED
            return
        self.state = RuntimeState.UNLOADING
        await asyncio.to_thread(self._drain_and_free, executor)
        self.state = RuntimeState.UNLOADED
        logger.info(
            "unloaded %s model %s version %s",
            self.engine_label,
            self.name,
            self.version,
            extra={"model": self.name, "version": self.version},
        )

    def _drain_and_free(self, executor: ThreadPoolExecutor) -> None:
        executor.shutdown(wait=True)
        self._free_engine()

    @abc.abstractmethod
    def _free_engine(self) -> None:
        """Release the engine (blocking; runs in a thread once no engine call is left)."""

    @abc.abstractmethod
    def _forget_engine(self) -> None:
        """Drop engine references when there is no executor (never loaded, or unloaded)."""


def instance_count(config: ModelConfig) -> int:
    """How many executions of one model version may run at once (Triton's instance count)."""
    return max(1, sum(max(group.count, 1) for group in config.instance_group))


def model_file(version_dir: Path, filename: str, *, model: str) -> Path:
    """The path of ``filename`` in ``version_dir``, refused if it could lead elsewhere.

    ``filename`` must be a plain file name (config parsing already refuses others; this is
    checked again where files are opened, whatever built the config), and the version
    folder must resolve inside the model folder, so a version folder symlinked elsewhere
    is refused. A symlinked *file* is left to the storage layer, which resolves every link
    against the allowed storage roots (it lays a single model file out as such a link).

    Raises :class:`ModelLoadError` naming ``model``.
    """
    try:
        model_config.check_file_name(filename, field="default_model_filename")
    except model_config.ConfigError as exc:
        raise ModelLoadError(model=model, reason=str(exc)) from exc
    model_dir = version_dir.parent.resolve()
    real = version_dir.resolve()
    if real == model_dir or not real.is_relative_to(model_dir):
        raise ModelLoadError(
            model=model,
            reason=f"version folder {version_dir.name} resolves to {real}, "
            f"outside the model folder {model_dir}",
        )
    return version_dir / filename
