"""ONNX Runtime behind :class:`~runtimes.base.ModelRuntime`.

One ``InferenceSession`` per loaded version, shared by the runtime's executor threads (one
per configured instance): ``InferenceSession.run`` is thread-safe, so instances cost
threads, not copies of the weights. A small batching model on a CPU of several cores
gets a second session on a wide, spinning pool for its small batches
(:mod:`runtimes.onnx.threads` says why): a second copy of weights under 32 MiB, and
10-30 ms more load time. How the session is opened is
:mod:`runtimes.onnx.builder`'s (providers, options) and, with a node cache folder
(``RuntimeOptions.cache_dir``), :mod:`runtimes.onnx.engine_cache`'s; what it serves and
how values cross is :mod:`runtimes.onnx.session`'s.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from foundation.proto import model_config_pb2 as mc
from runtimes.base import (
    ExecutorRuntime,
    RuntimeOptions,
    RuntimeState,
    instance_count,
    model_file,
)
from runtimes.cache.engines import EngineCache
from runtimes.cache.pins import LockTimeoutError, Pin
from runtimes.errors import ModelLoadError, ModelNotReadyError
from runtimes.onnx.builder import SessionBuilder
from runtimes.onnx.complete import complete_from_graph
from runtimes.onnx.engine_cache import ENGINE_CACHE_RUNTIME, open_with_engine_cache
from runtimes.onnx.session import Session

logger = logging.getLogger(__name__)


class OnnxRuntime(ExecutorRuntime):
    """Serves ``model.onnx`` files with ONNX Runtime.

    Thread-safety: :meth:`infer` may be awaited concurrently; at most ``instance count``
    batches run at once, on threads named ``ort-<model>`` (a small one-instance model's
    one-row batches on the event loop, :func:`runtimes.onnx.threads.runs_on_event_loop`).
    :meth:`load` and :meth:`unload` must not overlap each other or :meth:`infer` (the
    repository serializes them).
    """

    kind = "onnxruntime"
    engine_label = "ONNX"
    model_filename = "model.onnx"
    # Triton's default for its ONNX Runtime backend on CPU: one batch is formed and
    # dispatched while the other executes.
    default_cpu_instances = 2

    def __init__(self, *, name: str, version: int, options: RuntimeOptions) -> None:
        super().__init__(name=name, version=version, options=options)
        self._session: Session | None = None
        self._engine_pin: Pin | None = None
        self.engine_cache_hit: bool | None = None
        """After :meth:`load`: whether the warm engine cache served it (None: no cache)."""

    @classmethod
    def complete_config(cls, version_dir: Path, config: mc.ModelConfig) -> None:
        """Triton-style auto-complete from the ONNX graph (see :mod:`runtimes.onnx.complete`).

        A missing file is left to :meth:`load`.
        """
        model_name = config.name or version_dir.parent.name
        path = model_file(
            version_dir, config.default_model_filename or cls.model_filename, model=model_name
        )
        if not path.is_file():
            return
        complete_from_graph(path, config, model=model_name, backend=cls.kind)

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
        if session.runs_inline(batch):
            return session.run(batch)
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
    ) -> tuple[Session, Pin | None, bool | None]:
        path = model_file(
            model_dir, config.default_model_filename or self.model_filename, model=self.name
        )
        if not path.is_file():
            raise ModelLoadError(model=self.name, reason=f"{path} does not exist")
        weight_bytes = sum(f.stat().st_size for f in model_dir.rglob("*") if f.is_file())
        builder = SessionBuilder(self.name, config, self.options, weight_bytes)
        if self.options.cache_dir is None:
            providers = builder.providers(device, trt_cache=None)
            session = builder.open(path, builder.session_options(), providers)
            pin, hit = None, None
        else:
            engines = EngineCache(self.options.cache_dir, ENGINE_CACHE_RUNTIME)
            try:
                session, pin, hit = open_with_engine_cache(builder, engines, path, device)
            except (OSError, LockTimeoutError) as exc:
                # The engine cache is an optimization: its folder being unwritable or full,
                # or locked too long, must not fail a load that works without it.
                logger.warning(
                    "engine cache unavailable for model %s (%s); loading without it",
                    self.name,
                    exc,
                    extra={"model": self.name},
                )
                providers = builder.providers(device, trt_cache=None)
                session = builder.open(path, builder.session_options(), providers)
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
            made = Session.create(session, config, active, builder.load_error)
            wide = builder.latency_policy(device)
            if wide is not None:
                made = made.with_latency_session(
                    builder.open(
                        path,
                        builder.session_options(wide),
                        builder.providers(device, trt_cache=None),
                    )
                )
            return made, pin, hit
        except BaseException:
            if pin is not None:
                pin.release()
            raise
