"""PyTorch behind :class:`~runtimes.base.ModelRuntime`: TorchScript and ``torch.export``.

A version folder holds ``model.pt`` (TorchScript, loaded with ``torch.jit.load``) or
``model.pt2`` (a ``torch.export`` program, loaded with ``torch.export.load``); a config
``default_model_filename`` picks one explicitly. Loading either can run code the file
carries (``torch.export.load`` unpickles), so, as in Triton, the model repository is trusted
input; the runtime never calls ``torch.load`` itself.

Tensors map by position, as Triton's libtorch backend does with its ``INPUT__0`` naming:
``forward`` receives the config's inputs in config order, and its result maps to the
config's outputs: a tensor to the single output, a tuple or list in config order, a dict
by name. The config must therefore list its inputs and outputs (no auto-complete).

torch is an optional extra (``zeroserve[torch]``), imported inside :meth:`TorchRuntime.load`
so this module imports without it. Thread counts from :class:`RuntimeOptions` are not
applied: ``torch.set_num_threads`` is process-wide and would retune every other model.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import re
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from foundation import datatypes
from foundation.proto import model_config_pb2 as mc
from runtimes.base import (
    ExecutorRuntime,
    RuntimeOptions,
    RuntimeState,
    instance_count,
    model_file,
)
from runtimes.errors import (
    InternalError,
    InvalidArgumentError,
    ModelLoadError,
    ModelNotReadyError,
)

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

TORCHSCRIPT_FILENAME: Final = "model.pt"
EXPORT_FILENAME: Final = "model.pt2"

_DEVICE: Final = re.compile(r"cpu|cuda:\d+")

_TENSOR_DATATYPES: Final = frozenset(datatypes.NUMPY_DTYPES) - {"BYTES"}
"""Datatypes with a torch tensor form (numpy's, plus BF16 cast on the device); not BYTES."""


class TorchRuntime(ExecutorRuntime):
    """Serves TorchScript (``model.pt``) and ``torch.export`` (``model.pt2``) models.

    Runs under ``torch.inference_mode()`` on ``cpu`` or ``cuda:N``. One module is shared
    by the executor's threads (``torch-<model>``, one per instance); TorchScript and
    exported modules hold no per-call state, so concurrent forwards are safe.
    """

    kind = "pytorch"
    engine_label = "PyTorch"
    model_filename = TORCHSCRIPT_FILENAME

    def __init__(self, *, name: str, version: int, options: RuntimeOptions) -> None:
        super().__init__(name=name, version=version, options=options)
        self._model: _TorchModel | None = None

    async def load(self, model_dir: Path, config: mc.ModelConfig, device: str) -> None:
        """Load the module onto ``device``; see :class:`ModelRuntime`.

        Raises :class:`ModelLoadError` when torch is missing, the device is unknown or
        unavailable, no model file is found, the file does not load, or the config lacks
        inputs/outputs or uses BYTES.
        """
        if self.state is not RuntimeState.NEW:
            raise RuntimeError(f"load() called on a runtime in state {self.state.value}")
        self.state = RuntimeState.LOADING
        executor = ThreadPoolExecutor(
            max_workers=instance_count(config), thread_name_prefix=f"torch-{self.name}"
        )
        loop = asyncio.get_running_loop()
        try:
            model = await loop.run_in_executor(executor, self._load_sync, model_dir, config, device)
        except BaseException:
            executor.shutdown(wait=False, cancel_futures=True)
            self.state = RuntimeState.FAILED
            raise
        self._executor, self._model = executor, model
        self.state = RuntimeState.READY
        logger.info(
            "loaded PyTorch model %s version %s from %s on %s",
            self.name,
            self.version,
            model.filename,
            device,
            extra={"model": self.name, "version": self.version, "device": device},
        )

    async def infer(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run ``forward`` on one batch; see :class:`ModelRuntime`.

        Raises :class:`InvalidArgumentError` for missing or unknown inputs and
        :class:`InternalError` when ``forward`` raises or returns something that does not
        map onto the configured outputs.
        """
        model, executor = self._model, self._executor
        if self.state is not RuntimeState.READY or model is None or executor is None:
            raise ModelNotReadyError(f"model '{self.name}' version {self.version} is not ready")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(executor, model.run, batch)

    def _forget_engine(self) -> None:
        self._model = None

    def _free_engine(self) -> None:
        """Drop the module, collect it and, on CUDA, empty torch's caching allocator.

        The CUDA context itself stays (torch never releases it), so device memory returns
        to its level after the first CUDA use, not to zero.
        """
        model, self._model = self._model, None
        if model is None:
            return
        torch, device = model.torch, model.device
        del model
        # Parameters can sit in reference cycles (module <-> hooks); collect before asking
        # the caching allocator to hand its now-free blocks back to the driver.
        gc.collect()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()

    def _load_sync(self, model_dir: Path, config: mc.ModelConfig, device: str) -> _TorchModel:
        try:
            import torch
        except ImportError as exc:
            raise self._load_error(
                "PyTorch is not installed; install the extra: pip install 'zeroserve[torch]'"
            ) from exc
        if _DEVICE.fullmatch(device) is None:
            raise self._load_error(f"unknown device {device!r}; expected 'cpu' or 'cuda:N'")
        torch_device = torch.device(device)
        if torch_device.type == "cuda" and not torch.cuda.is_available():
            raise self._load_error(f"device {device} requested but torch sees no CUDA device")
        try:
            inputs = _tensors("input", config.input)
            outputs = _tensors("output", config.output)
        except ValueError as exc:
            raise self._load_error(str(exc)) from exc
        path = self._model_path(model_dir, config)
        try:
            if path.suffix == ".pt2":
                module = self._load_export(torch, path, torch_device)
            else:
                module = torch.jit.load(  # type: ignore[no-untyped-call]
                    str(path), map_location=torch_device
                )
                module.eval()
        except Exception as exc:
            raise self._load_error(f"torch cannot load {path.name}: {exc}") from exc
        return _TorchModel(torch, module, torch_device, path.name, inputs, outputs)

    @staticmethod
    def _load_export(torch_module: Any, path: Path, device: torch.device) -> Any:
        program = torch_module.export.load(str(path))
        if device.type != "cpu":
            # module().to() would miss device constants baked into the graph; the pass
            # rewrites them as well.
            from torch.export.passes import move_to_device_pass

            program = move_to_device_pass(program, device)
        return program.module()

    def _model_path(self, model_dir: Path, config: mc.ModelConfig) -> Path:
        if config.default_model_filename:
            candidates = [config.default_model_filename]
        else:
            candidates = [TORCHSCRIPT_FILENAME, EXPORT_FILENAME]
        for candidate in candidates:
            path = model_file(model_dir, candidate, model=self.name)
            if path.is_file():
                return path
        raise self._load_error(f"no {' or '.join(candidates)} in {model_dir}")

    def _load_error(self, reason: str) -> ModelLoadError:
        return ModelLoadError(model=self.name, reason=reason)


def device_memory_in_use_bytes(device: str) -> int:
    """Bytes in use on a CUDA device, by every process and allocator (total - free).

    Meant for tests and diagnostics; covers memory torch's allocator does not see (ONNX
    Runtime arenas, CUDA contexts). Raises ImportError without torch.
    """
    import torch

    free, total = torch.cuda.mem_get_info(torch.device(device))
    return int(total - free)


@dataclass(frozen=True)
class _Tensor:
    name: str
    datatype: str


@dataclass(frozen=True)
class _TorchModel:
    """A loaded module and how to call it."""

    torch: Any
    """The torch module object, kept here so that no module-level import is needed."""
    module: Any
    device: torch.device
    filename: str
    inputs: tuple[_Tensor, ...]
    outputs: tuple[_Tensor, ...]

    def run(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run ``forward`` on the calling thread (an executor worker)."""
        unknown = batch.keys() - {t.name for t in self.inputs}
        if unknown:
            raise InvalidArgumentError(f"unexpected inference input {sorted(unknown)[0]!r}")
        torch = self.torch
        with torch.inference_mode():
            args = []
            for tensor in self.inputs:
                if tensor.name not in batch:
                    raise InvalidArgumentError(f"expected inference input {tensor.name!r}")
                args.append(self._to_torch(tensor, batch[tensor.name]))
            try:
                result = self.module(*args)
            except Exception as exc:
                raise InternalError(f"PyTorch model failed: {exc}") from exc
            return self._outputs(result)

    def _to_torch(self, tensor: _Tensor, array: np.ndarray) -> Any:
        torch = self.torch
        # from_numpy shares memory and warns on read-only arrays (request buffers are).
        value = torch.from_numpy(array if array.flags.writeable else array.copy())
        value = value.to(self.device)
        if tensor.datatype == "BF16":
            value = value.to(torch.bfloat16)
        return value

    def _outputs(self, result: Any) -> dict[str, np.ndarray]:
        torch = self.torch
        names = [t.name for t in self.outputs]
        if isinstance(result, torch.Tensor):
            values = [result]
        elif isinstance(result, Mapping):
            missing = [n for n in names if n not in result]
            if missing:
                raise InternalError(
                    f"PyTorch model returned no output {missing[0]!r} (keys: {sorted(result)})"
                )
            values = [result[n] for n in names]
        elif isinstance(result, Sequence):
            values = list(result)
        else:
            raise InternalError(f"PyTorch model returned {type(result).__name__}, not tensors")
        if len(values) != len(names):
            raise InternalError(
                f"PyTorch model returned {len(values)} outputs; the config lists {len(names)}"
            )
        return {t.name: self._to_numpy(t, v) for t, v in zip(self.outputs, values, strict=True)}

    def _to_numpy(self, tensor: _Tensor, value: Any) -> np.ndarray:
        torch = self.torch
        if not isinstance(value, torch.Tensor):
            raise InternalError(
                f"PyTorch model output {tensor.name!r} is {type(value).__name__}, not a tensor"
            )
        value = value.detach()
        if value.dtype == torch.bfloat16:
            # numpy has no bfloat16; the server carries BF16 as float32.
            value = value.float()
        array: np.ndarray = value.cpu().numpy()
        expected = datatypes.NUMPY_DTYPES[tensor.datatype]
        if array.dtype != expected:
            raise InternalError(
                f"PyTorch model output {tensor.name!r} is {array.dtype}; "
                f"the config says {tensor.datatype}"
            )
        return array


def _tensors(kind: str, entries: Sequence[mc.ModelInput | mc.ModelOutput]) -> tuple[_Tensor, ...]:
    """The config's tensors in order; ValueError says why they cannot be served."""
    if not entries:
        raise ValueError(
            f"PyTorch models need their {kind}s listed in config.pbtxt, in forward() order"
        )
    tensors = []
    for entry in entries:
        datatype = datatypes.protocol_from_config(entry.data_type) if entry.data_type else ""
        if datatype not in _TENSOR_DATATYPES:
            name = mc.DataType.Name(entry.data_type)
            raise ValueError(
                f"{kind} {entry.name!r} has datatype {name}, which PyTorch models cannot take"
            )
        tensors.append(_Tensor(entry.name, datatype))
    return tuple(tensors)
