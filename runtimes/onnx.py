"""ONNX Runtime behind :class:`~runtimes.base.ModelRuntime`.

One ``InferenceSession`` per loaded version, shared by the runtime's executor threads (one
per configured instance): ``InferenceSession.run`` is thread-safe, so instances cost
threads, not copies of the weights. Execution providers follow the device: ``cuda:N``
tries TensorRT, then CUDA, then falls back to CPU; ``cpu`` uses the CPU provider only.

With a node cache folder (``RuntimeOptions.cache_dir``) the runtime keeps a warm engine
cache per model, hardware and ORT version (see ``runtimes.cache.engines``): the first load
saves ONNX Runtime's optimized model, its weights as an external file; later loads open that
file with graph optimizations off, so ORT memory-maps the weights instead of parsing and
optimizing the graph again. With ``disable_prepacking`` on, such a load costs milliseconds
and the weights are paged in by the first inference. On GPUs the TensorRT engine cache lives
in the same folder.

Datatypes the server and ONNX Runtime disagree on are translated at this boundary:
BYTES tensors (object arrays of ``bytes``) become ONNX string tensors (UTF-8 text) and
back, and BF16 tensors (float32 inside the server) are rounded to bfloat16 bits on the
way in and widened on the way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Final, TypeAlias, cast

import numpy as np
import onnx
import onnxruntime as ort
from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from foundation import datatypes
from foundation.proto import model_config_pb2 as mc
from runtimes.base import (
    ExecutorRuntime,
    RuntimeOptions,
    RuntimeState,
    instance_count,
    model_file,
)
from runtimes.cache.engines import EngineCache, hardware_identity, model_identity
from runtimes.cache.pins import LockTimeoutError, Pin
from runtimes.errors import (
    InternalError,
    InvalidArgumentError,
    ModelLoadError,
    ModelNotReadyError,
)

logger = logging.getLogger(__name__)

DEFAULT_MAX_BATCH_SIZE: Final = 4
"""What auto-complete sets ``max_batch_size`` to (Triton's ``default-max-batch-size``)."""

INTRA_OP_THREADS_PARAMETER: Final = "intra_op_thread_count"
"""Config ``parameters`` key overriding the intra-op thread count (Triton's ORT backend name)."""
INTER_OP_THREADS_PARAMETER: Final = "inter_op_thread_count"
"""Config ``parameters`` key overriding the inter-op thread count (Triton's ORT backend name)."""
ALLOW_SPINNING_PARAMETER: Final = "allow_spinning"
"""Config ``parameters`` key: ``true``/``false`` lets ONNX Runtime's idle threads spin or not.

Unset, spinning is on for models with at least :data:`SPINNING_MIN_WEIGHT_BYTES` of weights
and off below. Spinning threads wait for work by burning a core. For a small model the
server's event loop is the bottleneck and needs that core (measured on 2 cores, light MLP of
9.6 MB at 64 connections: 7,600 infer/s with spinning off, 6,000 with it on). For a large
model the engine is the bottleneck, the loop needs little, and without spinning the second
thread sleeps and wakes between every parallel section (heavy MLP of 168 MB: 1,000 infer/s
off, 1,300-1,450 on).
"""
SPINNING_MIN_WEIGHT_BYTES: Final = 32 * 2**20
"""Weight size (the version folder's files) from which spinning is on unless configured."""
DISABLE_PREPACKING_PARAMETER: Final = "disable_prepacking"
"""Config ``parameters`` key: ``true`` skips weight prepacking at session creation.

Prepacking copies every weight into a layout the CPU kernels prefer: a load reads all the
weights up front, and later inferences are faster. Without it, a load from the warm engine
cache memory-maps the weights and returns in milliseconds, and the first inference pays
for paging them in. Which is better is per model; ``bench/cold_start.py`` measures both."""
ENGINE_CACHE_RUNTIME: Final = "onnxruntime"
"""The folder of this runtime's engines under ``<cache_dir>/engines/``."""
_OPTIMIZED_MODEL: Final = "model.onnx"
_OPTIMIZED_WEIGHTS: Final = "model.onnx.data"
_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off", ""})

_ORT_TYPES: Final[dict[str, str]] = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
    "tensor(bfloat16)": "BF16",
}
"""ONNX Runtime's type strings -> protocol datatypes; anything absent cannot be served."""

_ONNX_ELEM_TYPES: Final[dict[int, str]] = {
    onnx.TensorProto.BOOL: "BOOL",
    onnx.TensorProto.UINT8: "UINT8",
    onnx.TensorProto.UINT16: "UINT16",
    onnx.TensorProto.UINT32: "UINT32",
    onnx.TensorProto.UINT64: "UINT64",
    onnx.TensorProto.INT8: "INT8",
    onnx.TensorProto.INT16: "INT16",
    onnx.TensorProto.INT32: "INT32",
    onnx.TensorProto.INT64: "INT64",
    onnx.TensorProto.FLOAT16: "FP16",
    onnx.TensorProto.FLOAT: "FP32",
    onnx.TensorProto.DOUBLE: "FP64",
    onnx.TensorProto.STRING: "BYTES",
    onnx.TensorProto.BFLOAT16: "BF16",
}
"""ONNX ``TensorProto`` element types -> protocol datatypes."""

_CUDA_DEVICE: Final = re.compile(r"cuda:(\d+)")

_Provider: TypeAlias = tuple[str, dict[str, str]]
_TensorEntries: TypeAlias = (
    RepeatedCompositeFieldContainer[mc.ModelInput] | RepeatedCompositeFieldContainer[mc.ModelOutput]
)


class OnnxRuntime(ExecutorRuntime):
    """Serves ``model.onnx`` files with ONNX Runtime.

    Thread-safety: :meth:`infer` may be awaited concurrently; at most ``instance count``
    batches run at once, on threads named ``ort-<model>``. :meth:`load` and :meth:`unload`
    must not overlap each other or :meth:`infer` (the repository serializes them).
    """

    kind = "onnxruntime"
    engine_label = "ONNX"
    model_filename = "model.onnx"
    # Triton's default for its ONNX Runtime backend on CPU: one batch is formed and
    # dispatched while the other executes.
    default_cpu_instances = 2

    def __init__(self, *, name: str, version: int, options: RuntimeOptions) -> None:
        super().__init__(name=name, version=version, options=options)
        self._session: _Session | None = None
        self._weight_bytes = 0
        self._engine_pin: Pin | None = None
        self.engine_cache_hit: bool | None = None
        """After :meth:`load`: whether the warm engine cache served it (None: no cache)."""

    @classmethod
    def complete_config(cls, version_dir: Path, config: mc.ModelConfig) -> None:
        """Triton-style auto-complete from the ONNX graph.

        Adds the model's inputs and outputs the config does not list (and fills the
        datatype or dims of listed ones that lack them). When ``max_batch_size`` is 0, every
        input and output has a dynamic first dimension and the listed dims do not spell out
        the full rank, sets ``max_batch_size`` to :data:`DEFAULT_MAX_BATCH_SIZE`, adds
        ``dynamic_batching {}`` when no scheduler is set, and leaves dim 0 out of the dims.
        Reads only the graph's inputs, outputs and initializer names: the weights, inside
        the file or not, are skipped. A missing file is left to :meth:`load`.
        """
        model_name = config.name or version_dir.parent.name
        path = model_file(
            version_dir, config.default_model_filename or cls.model_filename, model=model_name
        )
        if not path.is_file():
            return
        try:
            graph_inputs, graph_outputs, initializers = read_graph_interface(path)
        except Exception as exc:
            raise ModelLoadError(
                model=model_name, reason=f"cannot read {path.name} as ONNX: {exc}"
            ) from exc
        try:
            # Before IR version 4 every initializer was also listed as a graph input; those
            # are weights, not request tensors.
            inputs = [_describe(v) for v in graph_inputs if v.name not in initializers]
            outputs = [_describe(v) for v in graph_outputs]
        except ValueError as exc:
            raise ModelLoadError(model=model_name, reason=str(exc)) from exc
        _complete(config, inputs, outputs)

    async def load(self, model_dir: Path, config: mc.ModelConfig, device: str) -> None:
        """Create the session on ``device``'s providers; see :class:`ModelRuntime`.

        Raises :class:`ModelLoadError` when the file is missing or invalid, the device is
        not ``cpu``/``cuda:N``, or the config's tensors disagree with the model's.
        """
        if self.state is not RuntimeState.NEW:
            raise RuntimeError(f"load() called on a runtime in state {self.state.value}")
        self.state = RuntimeState.LOADING
        executor = ThreadPoolExecutor(
            max_workers=instance_count(config), thread_name_prefix=f"ort-{self.name}"
        )
        loop = asyncio.get_running_loop()
        try:
            session, self._engine_pin, self.engine_cache_hit = await loop.run_in_executor(
                executor, self._create_session, model_dir, config, device
            )
        except BaseException:
            # On cancellation the session build finishes in the worker and is dropped with
            # its result; shutdown(wait=False) lets that thread exit afterwards.
            executor.shutdown(wait=False, cancel_futures=True)
            self.state = RuntimeState.FAILED
            raise
        self._executor, self._session = executor, session
        self.state = RuntimeState.READY
        logger.info(
            "loaded ONNX model %s version %s on %s with %s (engine cache %s)",
            self.name,
            self.version,
            device,
            session.providers,
            {None: "off", True: "hit", False: "miss"}[self.engine_cache_hit],
            extra={"model": self.name, "version": self.version, "device": device},
        )

    async def infer(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch; see :class:`ModelRuntime`.

        Raises :class:`InvalidArgumentError` for missing, unknown or malformed inputs (as
        ONNX Runtime judges them) and :class:`InternalError` when the engine fails.
        """
        session, executor = self._session, self._executor
        if self.state is not RuntimeState.READY or session is None or executor is None:
            raise ModelNotReadyError(f"model '{self.name}' version {self.version} is not ready")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(executor, session.run, batch)

    def _forget_engine(self) -> None:
        self._session = None
        self._release_engine()

    def _free_engine(self) -> None:
        # The session is in no reference cycle, so dropping it frees it (and its arenas)
        # now. No gc.collect(): a full collection holds the GIL for tens of milliseconds
        # in a process with torch imported, stalling every other model's requests.
        self._session = None
        self._release_engine()

    def _release_engine(self) -> None:
        pin, self._engine_pin = self._engine_pin, None
        if pin is not None:
            pin.release()

    def _create_session(
        self, model_dir: Path, config: mc.ModelConfig, device: str
    ) -> tuple[_Session, Pin | None, bool | None]:
        path = model_file(
            model_dir, config.default_model_filename or self.model_filename, model=self.name
        )
        if not path.is_file():
            raise self._load_error(f"{path} does not exist")
        self._weight_bytes = sum(f.stat().st_size for f in model_dir.rglob("*") if f.is_file())
        if self.options.cache_dir is None:
            providers = self._providers(device, trt_cache=None)
            session = self._open(path, self._session_options(config), providers)
            pin, hit = None, None
        else:
            engines = EngineCache(self.options.cache_dir, ENGINE_CACHE_RUNTIME)
            try:
                session, pin, hit = self._open_with_engine_cache(engines, path, config, device)
            except (OSError, LockTimeoutError) as exc:
                # The engine cache is an optimization: its folder being unwritable or full,
                # or locked too long, must not fail a load that works without it.
                logger.warning(
                    "engine cache unavailable for model %s (%s); loading without it",
                    self.name,
                    exc,
                    extra={"model": self.name},
                )
                providers = self._providers(device, trt_cache=None)
                session = self._open(path, self._session_options(config), providers)
                pin, hit = None, None
        try:
            active = list(session.get_providers())
            if device != "cpu" and active[:1] == ["CPUExecutionProvider"]:
                logger.warning(
                    "model %s asked for %s but ONNX Runtime runs it on CPU (providers %s)",
                    self.name,
                    device,
                    active,
                    extra={"model": self.name, "device": device},
                )
            return _Session.create(session, config, active, self._load_error), pin, hit
        except BaseException:
            if pin is not None:
                pin.release()
            raise

    def _open_with_engine_cache(
        self, engines: EngineCache, path: Path, config: mc.ModelConfig, device: str
    ) -> tuple[ort.InferenceSession, Pin | None, bool]:
        """Open from the warm engine cache, or build and fill it; the engine comes pinned."""
        key_parts = {
            "model": [path.name, model_identity(path.parent)],
            "onnxruntime": ort.__version__,
            "hardware": hardware_identity(device),
            "providers": [name for name, _ in self._providers(device, trt_cache=None)],
        }
        key = engines.key(key_parts)
        if self._providers(device, trt_cache=None)[0][0] == "TensorrtExecutionProvider":
            # TensorRT writes (and rewrites, for new shapes) its engines in place and cannot
            # be saved as an optimized model: keep its own engine cache in the key folder.
            pin, hit = engines.shared(key)
            try:
                with engines.lock(key):
                    providers = self._providers(device, trt_cache=pin.path.parent / "trt")
                    return self._open(path, self._session_options(config), providers), pin, hit
            except BaseException:
                pin.release()
                raise
        providers = self._providers(device, trt_cache=None)
        cached = engines.open(key)
        if cached is not None:
            optimized = cached.path.parent / _OPTIMIZED_MODEL
            _prefetch(cached.path.parent / _OPTIMIZED_WEIGHTS)
            options = self._session_options(config, optimize=False)
            try:
                session = ort.InferenceSession(
                    str(optimized), sess_options=options, providers=providers, enable_fallback=0
                )
                return session, cached, True
            except Exception as exc:
                cached.release()
                logger.warning(
                    "engine cache %s of model %s is unusable (%s); rebuilding",
                    optimized.parent,
                    self.name,
                    exc,
                    extra={"model": self.name},
                )
                engines.discard(key)
        with engines.build(key) as build:
            options = self._session_options(config, save_to=build.path / _OPTIMIZED_MODEL)
            try:
                session = self._open(path, options, providers)
            except ModelLoadError:
                # Saving the optimized model is what failed, or the model is bad: find out
                # without the cache (this raises the model's own error if it is bad).
                session = self._open(path, self._session_options(config), providers)
                logger.warning(
                    "model %s loads but its optimized form cannot be saved; no engine cache",
                    self.name,
                    extra={"model": self.name},
                )
                return session, None, False
            try:
                pin = build.publish({"key": key_parts, "source": str(path)})
            except OSError as exc:  # a full disk must not fail a load that worked
                logger.warning(
                    "cannot keep the engine of model %s: %s",
                    self.name,
                    exc,
                    extra={"model": self.name},
                )
                return session, None, False
        return session, pin, False

    def _session_options(
        self, config: mc.ModelConfig, *, optimize: bool = True, save_to: Path | None = None
    ) -> ort.SessionOptions:
        options = ort.SessionOptions()
        options.intra_op_num_threads = self._thread_count(
            config, INTRA_OP_THREADS_PARAMETER, self.options.intra_op_threads
        )
        options.inter_op_num_threads = self._thread_count(
            config, INTER_OP_THREADS_PARAMETER, self.options.inter_op_threads
        )
        if ALLOW_SPINNING_PARAMETER in config.parameters:
            is_spinning = self._flag(config, ALLOW_SPINNING_PARAMETER)
        else:
            is_spinning = self._weight_bytes >= SPINNING_MIN_WEIGHT_BYTES
        spinning = "1" if is_spinning else "0"
        options.add_session_config_entry("session.intra_op.allow_spinning", spinning)
        options.add_session_config_entry("session.inter_op.allow_spinning", spinning)
        if self._flag(config, DISABLE_PREPACKING_PARAMETER):
            options.add_session_config_entry("session.disable_prepacking", "1")
        if not optimize:
            # The cached model was optimized when it was saved; doing it again costs time
            # and would read every weight.
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        if save_to is not None:
            options.optimized_model_filepath = str(save_to)
            # Weights go to a separate file so that later loads can memory-map them.
            options.add_session_config_entry(
                "session.optimized_model_external_initializers_file_name", _OPTIMIZED_WEIGHTS
            )
            options.add_session_config_entry(
                "session.optimized_model_external_initializers_min_size_in_bytes", "1024"
            )
        return options

    def _open(
        self, path: Path, options: ort.SessionOptions, providers: list[_Provider]
    ) -> ort.InferenceSession:
        # ORT's own fallback (enable_fallback) would print to stdout on any error, corrupt
        # files included, and retry with provider names only, losing device_id. Ours keeps
        # the options and retries only what can help: the same providers without TensorRT,
        # whose libraries are often absent even where the wheel lists the provider.
        attempts = [providers]
        if providers[0][0] == "TensorrtExecutionProvider":
            attempts.append(providers[1:])
        for attempt, attempt_providers in enumerate(attempts, start=1):
            try:
                return ort.InferenceSession(
                    str(path), sess_options=options, providers=attempt_providers, enable_fallback=0
                )
            except Exception as exc:
                if attempt == len(attempts):
                    raise self._load_error(f"ONNX Runtime cannot load {path.name}: {exc}") from exc
                logger.warning(
                    "TensorRT failed for model %s (%s); retrying without it",
                    self.name,
                    exc,
                    extra={"model": self.name},
                )
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _providers(self, device: str, *, trt_cache: Path | None) -> list[_Provider]:
        if device == "cpu":
            return [("CPUExecutionProvider", {})]
        match = _CUDA_DEVICE.fullmatch(device)
        if match is None:
            raise self._load_error(f"unknown device {device!r}; expected 'cpu' or 'cuda:N'")
        device_id = match.group(1)
        available = set(ort.get_available_providers())
        providers: list[_Provider] = []
        if "TensorrtExecutionProvider" in available:
            trt: dict[str, str] = {"device_id": device_id}
            if trt_cache is not None:
                # Engines take minutes to build; the folder is keyed by model, GPU, driver
                # and ORT version (see _open_with_engine_cache).
                trt_cache.mkdir(parents=True, exist_ok=True)
                trt |= {"trt_engine_cache_enable": "True", "trt_engine_cache_path": str(trt_cache)}
            providers.append(("TensorrtExecutionProvider", trt))
        if "CUDAExecutionProvider" in available:
            providers.append(("CUDAExecutionProvider", {"device_id": device_id}))
        providers.append(("CPUExecutionProvider", {}))
        return providers

    def _thread_count(self, config: mc.ModelConfig, key: str, default: int) -> int:
        # `key in` rather than indexing: indexing a protobuf map inserts the key.
        if key not in config.parameters:
            return default
        text = config.parameters[key].string_value
        try:
            count = int(text)
        except ValueError:
            count = -1
        if count < 0:
            raise self._load_error(f"parameter {key} must be a non-negative integer, not {text!r}")
        return count

    def _flag(self, config: mc.ModelConfig, key: str) -> bool:
        if key not in config.parameters:
            return False
        text = config.parameters[key].string_value.strip().lower()
        if text not in _TRUE | _FALSE:
            raise self._load_error(f"parameter {key} must be true or false, not {text!r}")
        return text in _TRUE

    def _load_error(self, reason: str) -> ModelLoadError:
        return ModelLoadError(model=self.name, reason=reason)


def _prefetch(path: Path) -> None:
    """Ask the kernel to start reading ``path`` into the page cache (no wait, no error).

    ORT memory-maps external weights; without this the first inference would fault them in
    page by page as the kernels reach them, slower than the readahead of a sequential read.
    """
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        finally:
            os.close(fd)


@dataclass(frozen=True)
class _Tensor:
    name: str
    datatype: str
    """Protocol datatype (``FP32``)."""


@dataclass(frozen=True)
class _Session:
    """An ``InferenceSession`` with the request/response translation it needs."""

    session: ort.InferenceSession
    inputs: tuple[_Tensor, ...]
    outputs: tuple[_Tensor, ...]
    providers: tuple[str, ...]
    has_bf16: bool

    @classmethod
    def create(
        cls,
        session: ort.InferenceSession,
        config: mc.ModelConfig,
        providers: Sequence[str],
        load_error: Callable[[str], ModelLoadError],
    ) -> _Session:
        """Check ``config`` against the model and keep the tensors it will serve."""
        model_inputs = {i.name: i.type for i in session.get_inputs()}
        model_outputs = {o.name: o.type for o in session.get_outputs()}
        try:
            inputs = _select("input", config.input, model_inputs, require_all=True)
            outputs = _select("output", config.output, model_outputs, require_all=False)
        except ValueError as exc:
            raise load_error(str(exc)) from exc
        tensors = inputs + outputs
        has_bf16 = any(t.datatype == "BF16" for t in tensors)
        if has_bf16 and any(t.datatype == "BYTES" for t in tensors):
            # BF16 needs I/O binding (numpy has no bfloat16), which ORT refuses for strings.
            raise load_error("models mixing BF16 and BYTES tensors are not supported")
        return cls(session, inputs, outputs, tuple(providers), has_bf16)

    def run(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch on the calling thread (an executor worker)."""
        unknown = batch.keys() - {t.name for t in self.inputs}
        if unknown:
            raise InvalidArgumentError(f"unexpected inference input {sorted(unknown)[0]!r}")
        feeds: dict[str, Any] = {}
        for tensor in self.inputs:
            if tensor.name not in batch:
                raise InvalidArgumentError(f"expected inference input {tensor.name!r}")
            feeds[tensor.name] = _to_engine(tensor, batch[tensor.name])
        names = [t.name for t in self.outputs]
        try:
            values = self._run_bound(feeds) if self.has_bf16 else self.session.run(names, feeds)
        except Exception as exc:
            if isinstance(exc, ort.capi.onnxruntime_pybind11_state.InvalidArgument):
                raise InvalidArgumentError(str(exc)) from exc
            raise InternalError(f"ONNX Runtime failed: {exc}") from exc
        return {t.name: _from_engine(t, v) for t, v in zip(self.outputs, values, strict=True)}

    def _run_bound(self, feeds: Mapping[str, Any]) -> list[np.ndarray]:
        # Only I/O binding lets bfloat16 cross the Python boundary; outputs bound to "cpu"
        # come back as host OrtValues whose bytes we can copy.
        binding = self.session.io_binding()
        for name, value in feeds.items():
            if isinstance(value, np.ndarray):
                binding.bind_cpu_input(name, value)
            else:
                binding.bind_ortvalue_input(name, value)
        for tensor in self.outputs:
            binding.bind_output(tensor.name, "cpu")
        self.session.run_with_iobinding(binding)
        results: list[np.ndarray] = []
        for tensor, value in zip(self.outputs, binding.get_outputs(), strict=True):
            if tensor.datatype == "BF16":
                results.append(_bf16_ortvalue_to_float32(value))
            else:
                results.append(value.numpy())
        return results


def _select(
    kind: str, entries: _TensorEntries, model: Mapping[str, str], *, require_all: bool
) -> tuple[_Tensor, ...]:
    """The tensors to serve: the config's (checked against the model) or all the model's."""
    names = [e.name for e in entries] or list(model)
    for name in names:
        if name not in model:
            raise ValueError(
                f"configuration {kind} {name!r} is not a model {kind}; model {kind}s: "
                f"{sorted(model)}"
            )
    if require_all and (missing := sorted(set(model) - set(names))):
        raise ValueError(f"model {kind} {missing[0]!r} is missing from the configuration")
    configured = {e.name: e.data_type for e in entries}
    tensors: list[_Tensor] = []
    for name in names:
        datatype = _ORT_TYPES.get(model[name])
        if datatype is None:
            raise ValueError(f"model {kind} {name!r} has unsupported type {model[name]}")
        declared = configured.get(name, mc.TYPE_INVALID)
        if declared != mc.TYPE_INVALID and datatypes.protocol_from_config(declared) != datatype:
            raise ValueError(
                f"configuration {kind} {name!r} is "
                f"{mc.DataType.Name(declared)} but the model has {model[name]}"
            )
        tensors.append(_Tensor(name, datatype))
    return tuple(tensors)


def _to_engine(tensor: _Tensor, array: np.ndarray) -> Any:
    if tensor.datatype == "BYTES":
        return _bytes_to_text(tensor.name, array)
    if tensor.datatype == "BF16":
        bits = _float32_to_bf16_bits(np.asarray(array, dtype=np.float32))
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
            bits, onnx_element_type=onnx.TensorProto.BFLOAT16
        )
    return array


def _from_engine(tensor: _Tensor, array: np.ndarray) -> np.ndarray:
    if tensor.datatype == "BYTES":
        return _text_to_bytes(array)
    return array


def _bytes_to_text(name: str, array: np.ndarray) -> np.ndarray:
    """Object array of ``bytes`` -> object array of ``str`` (ORT wants UTF-8 text)."""
    out = np.empty(array.shape, dtype=object)
    flat = out.reshape(-1)
    for i, item in enumerate(array.reshape(-1)):
        if isinstance(item, str):
            flat[i] = item
            continue
        try:
            flat[i] = bytes(item).decode("utf-8")
        except (TypeError, UnicodeDecodeError) as exc:
            # ORT string tensors hold UTF-8; other bytes cannot cross its Python API.
            raise InvalidArgumentError(
                f"input {name!r} element {i} is not UTF-8 text, which ONNX string tensors need"
            ) from exc
    return out


def _text_to_bytes(array: np.ndarray) -> np.ndarray:
    out = np.empty(array.shape, dtype=object)
    flat = out.reshape(-1)
    for i, item in enumerate(array.reshape(-1)):
        flat[i] = item.encode("utf-8") if isinstance(item, str) else bytes(item)
    return out


def _float32_to_bf16_bits(array: np.ndarray) -> np.ndarray:
    """Round float32 to the nearest bfloat16 (ties to even), as uint16 bit patterns."""
    bits = np.ascontiguousarray(array).view(np.uint32)
    rounded = (bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16
    # Rounding a NaN payload can carry into the exponent or sign; keep it a quiet NaN.
    return np.where(np.isnan(array), np.uint32(0x7FC0), rounded).astype(np.uint16)


def _bf16_ortvalue_to_float32(value: Any) -> np.ndarray:
    shape = tuple(value.shape())
    size = int(value.tensor_size_in_bytes())
    raw = ctypes.string_at(value.data_ptr(), size) if size else b""
    bits = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
    return bits.view(np.float32).reshape(shape)


# Field numbers of onnx.proto (ModelProto.graph; GraphProto.initializer/input/output;
# TensorProto.name), and protobuf wire types.
_MODEL_GRAPH, _GRAPH_INITIALIZER, _GRAPH_INPUT, _GRAPH_OUTPUT, _TENSOR_NAME = 7, 5, 11, 12, 8
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


def read_graph_interface(
    path: Path,
) -> tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto], set[str]]:
    """A model's graph inputs, outputs and initializer names, without reading its weights.

    ``onnx.load`` parses every initializer: about 1.5 s for a 1 GB model whose weights are
    inside the file, paid on every load. This walks the protobuf wire format instead and
    seeks past everything else (kilobytes read, whatever the model's size). Models whose
    file does not follow the layout onnx writes fall back to ``onnx.load``.
    """
    try:
        with path.open("rb") as file:
            return _scan_model(file, path.stat().st_size)
    except (ValueError, IndexError, EOFError):
        graph = onnx.load(str(path), load_external_data=False).graph
        return list(graph.input), list(graph.output), {i.name for i in graph.initializer}


def _scan_model(
    file: BinaryIO, size: int
) -> tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto], set[str]]:
    inputs: list[onnx.ValueInfoProto] = []
    outputs: list[onnx.ValueInfoProto] = []
    initializers: set[str] = set()
    found_graph = False
    for field, length in _fields(file, size):
        if field != _MODEL_GRAPH or length is None:
            continue
        found_graph = True
        for sub, sub_length in _fields(file, file.tell() + length):
            if sub_length is None:
                continue
            if sub in (_GRAPH_INPUT, _GRAPH_OUTPUT):
                value = onnx.ValueInfoProto.FromString(_read_exactly(file, sub_length))
                (inputs if sub == _GRAPH_INPUT else outputs).append(value)
            elif sub == _GRAPH_INITIALIZER:
                end = file.tell() + sub_length
                for tensor_field, tensor_length in _fields(file, end):
                    if tensor_field == _TENSOR_NAME and tensor_length is not None:
                        initializers.add(_read_exactly(file, tensor_length).decode("utf-8"))
                    elif tensor_length is not None:
                        file.seek(tensor_length, os.SEEK_CUR)
            else:
                file.seek(sub_length, os.SEEK_CUR)
    if not found_graph:
        raise ValueError("no graph in the model file")
    return inputs, outputs, initializers


def _fields(file: BinaryIO, end: int) -> Iterator[tuple[int, int | None]]:
    """Walk the fields of a message ending at offset ``end``: ``(number, length)`` for
    length-delimited ones (the caller reads or seeks past the bytes), ``(number, None)``
    for scalars (already skipped)."""
    while file.tell() < end:
        key = _varint(file)
        field, wire = key >> 3, key & 7
        if wire == _LENGTH:
            length = _varint(file)
            if file.tell() + length > end:
                raise ValueError("field runs past its message")
            yield field, length
        elif wire == _VARINT:
            _varint(file)
            yield field, None
        elif wire in (_FIXED64, _FIXED32):
            file.seek(8 if wire == _FIXED64 else 4, os.SEEK_CUR)
            yield field, None
        else:
            raise ValueError(f"unsupported wire type {wire}")
    if file.tell() != end:
        raise ValueError("message ends inside a field")


def _varint(file: BinaryIO) -> int:
    result = shift = 0
    while True:
        byte = file.read(1)
        if not byte:
            raise EOFError("truncated varint")
        result |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return result
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _read_exactly(file: BinaryIO, length: int) -> bytes:
    data = file.read(length)
    if len(data) != length:
        raise EOFError("truncated field")
    return data


@dataclass(frozen=True)
class _GraphTensor:
    """A graph input or output as auto-complete sees it."""

    name: str
    datatype: str
    shape: tuple[int, ...] | None
    """Dimensions with -1 for symbolic or unknown ones; None when the rank is unknown."""


def _describe(value: onnx.ValueInfoProto) -> _GraphTensor:
    if value.type.WhichOneof("value") != "tensor_type":
        raise ValueError(f"model tensor {value.name!r} is not a tensor; only tensors are served")
    tensor_type = value.type.tensor_type
    datatype = _ONNX_ELEM_TYPES.get(tensor_type.elem_type)
    if datatype is None:
        elem = onnx.TensorProto.DataType.Name(tensor_type.elem_type)
        raise ValueError(f"model tensor {value.name!r} has unsupported element type {elem}")
    shape: tuple[int, ...] | None = None
    if tensor_type.HasField("shape"):
        shape = tuple(
            d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1
            for d in tensor_type.shape.dim
        )
    return _GraphTensor(value.name, datatype, shape)


def _complete(
    config: mc.ModelConfig, inputs: Sequence[_GraphTensor], outputs: Sequence[_GraphTensor]
) -> None:
    """Auto-complete ``config`` from the graph's tensors; see ``complete_config``."""
    if config.max_batch_size == 0 and _can_batch(config, inputs, outputs):
        config.max_batch_size = DEFAULT_MAX_BATCH_SIZE
        if config.WhichOneof("scheduling_choice") is None:
            config.dynamic_batching.SetInParent()
    is_batched = config.max_batch_size > 0
    for tensor in inputs:
        _complete_tensor(config.input, tensor, is_batched)
    for tensor in outputs:
        _complete_tensor(config.output, tensor, is_batched)
    if not config.backend and not config.platform:
        config.backend = OnnxRuntime.kind


def _can_batch(
    config: mc.ModelConfig, inputs: Sequence[_GraphTensor], outputs: Sequence[_GraphTensor]
) -> bool:
    graph = [*inputs, *outputs]
    if not graph or any(not t.shape or t.shape[0] != -1 for t in graph):
        return False
    shapes = {t.name: t.shape for t in graph}
    # Listed dims of the model's full rank mean the user counts dim 0 as data, not batch.
    listed = [(e.name, len(e.dims)) for e in config.input]
    listed += [(e.name, len(e.dims)) for e in config.output]
    return not any(rank and rank == len(shapes.get(name) or ()) for name, rank in listed)


def _complete_tensor(entries: _TensorEntries, tensor: _GraphTensor, is_batched: bool) -> None:
    if tensor.shape is None:
        dims: list[int] = [-1]
    else:
        dims = list(tensor.shape[1:] if is_batched else tensor.shape)
    entry = next((e for e in entries if e.name == tensor.name), None)
    if entry is None:
        entry = entries.add()
        entry.name = tensor.name
    if entry.data_type == mc.TYPE_INVALID:
        entry.data_type = cast(mc.DataType, datatypes.config_from_protocol(tensor.datatype))
    if not entry.dims:
        entry.dims.extend(dims)
