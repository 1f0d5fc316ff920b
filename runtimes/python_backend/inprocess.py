"""zeroserve's own Python-model contract, run in the server's process (the fast path).

A version folder holds ``model.py`` defining ``class TritonPythonModel`` whose ``execute``
takes one merged batch as a dict of arrays (:mod:`runtimes.python_model` says how a model
is found to follow this contract rather than Triton's). The contract:

``initialize(self, args: dict[str, str]) -> None`` (optional)
    Called once per instance at load, on a worker thread. ``args`` carries Triton's keys:
    ``model_config`` (the config as JSON, proto field names, int64 fields as numbers),
    ``model_name``, ``model_version``, ``model_instance_kind`` (``CPU`` or ``GPU``),
    ``model_instance_name``, ``model_instance_device_id`` and ``model_repository`` (the
    model's folder, parent of the version folder). An exception fails the load.
``execute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]``
    Called with one already-batched set of named arrays (dim 0 is the batch when the
    model batches; BYTES as object arrays of ``bytes``, BF16 as float32) and returns named
    arrays: every configured output (extra keys are dropped), each of its configured
    dtype; ``str`` arrays are accepted for BYTES outputs. Raising a
    :class:`~foundation.errors.ZeroserveError` (for example
    ``data_plane.errors.InvalidArgumentError``) passes it to the client as is; any other
    exception becomes an ``InternalError``.
``finalize(self) -> None`` (optional)
    Called once per instance at unload; an exception is logged and does not stop unload.

Custom metrics as Triton's Python backend offers them work here too: ``from
runtimes.python_backend import pb_utils`` and ``pb_utils.MetricFamily(...)`` in
``initialize`` or ``execute`` (the model's executor threads carry its binding); they go
with the model at unload.

Each of the ``instance_group`` count instances is used by one executor thread at a time, so
instance state needs no locking. ``model.py`` runs in this process under a unique module
name; it can import installed packages but not sibling files of its folder (that would
need a process-wide ``sys.path`` change). Running in the server's process, it shares the
server's fate: a crash, a leak or a GIL held for long is the server's too. Triton-style
models get a process each instead (:mod:`runtimes.python_backend.runtime`).

Example ``model.py``::

    import numpy as np

    class TritonPythonModel:
        def initialize(self, args):
            self.scale = 2

        def execute(self, inputs):
            return {"OUTPUT0": inputs["INPUT0"] * self.scale}
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import gc
import importlib.util
import json
import logging
import queue
import re
import sys
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from foundation import datatypes, model_config
from foundation.errors import ZeroserveError
from foundation.proto import model_config_pb2 as mc
from foundation.sequence_config import sequence_outputs
from runtimes.base import (
    ExecutorRuntime,
    RuntimeOptions,
    RuntimeState,
    instance_count,
    model_file,
)
from runtimes.custom_metrics import CustomMetrics, MetricError, run_operation
from runtimes.errors import InternalError, ModelLoadError, ModelNotReadyError
from runtimes.python_backend import pb_utils

logger = logging.getLogger(__name__)

MODEL_CLASS_NAME: Final = "TritonPythonModel"
"""The class ``model.py`` must define."""

_DEVICE: Final = re.compile(r"cpu|cuda:(\d+)")


class InProcessRuntime(ExecutorRuntime):
    """Runs dict-contract ``TritonPythonModel`` instances in this process; see the module
    docstring.

    Thread-safety: :meth:`infer` may be awaited concurrently; each batch borrows one idle
    instance on a ``python-<model>`` executor thread and returns it when done.
    """

    kind = "python"
    engine_label = "Python"
    model_filename = "model.py"

    def __init__(self, *, name: str, version: int, options: RuntimeOptions) -> None:
        super().__init__(name=name, version=version, options=options)
        self._pool: _InstancePool | None = None
        self._metrics: _MetricsHost | None = None

    async def load(self, model_dir: Path, config: mc.ModelConfig, device: str) -> None:
        """Import ``model.py`` and initialize one instance per configured instance.

        Raises :class:`ModelLoadError` when the file is missing, fails to import, lacks
        ``TritonPythonModel`` or an ``execute`` method, or ``initialize`` raises; instances
        already initialized are finalized first.
        """
        if self.state is not RuntimeState.NEW:
            raise RuntimeError(f"load() called on a runtime in state {self.state.value}")
        self.state = RuntimeState.LOADING
        count = instance_count(config)
        metrics = _MetricsHost(self.options.custom_metrics, f"{self.name}_0")
        self._metrics = metrics
        executor = ThreadPoolExecutor(
            max_workers=count,
            thread_name_prefix=f"python-{self.name}",
            initializer=pb_utils.bind_thread_metrics,
            initargs=(metrics,),
        )
        # submit + wrap_future (what run_in_executor does) keeps the concurrent future, so a
        # load cancelled while initialize() runs can still finalize what it built.
        future = executor.submit(self._load_sync, model_dir, config, device, count)
        try:
            pool = await asyncio.wrap_future(future)
        except BaseException:
            future.add_done_callback(functools.partial(_close_abandoned, model=self.name))
            executor.shutdown(wait=False, cancel_futures=True)
            metrics.close()
            self.state = RuntimeState.FAILED
            raise
        self._executor, self._pool = executor, pool
        self.state = RuntimeState.READY
        logger.info(
            "loaded Python model %s version %s with %d instances",
            self.name,
            self.version,
            count,
            extra={"model": self.name, "version": self.version, "device": device},
        )

    async def infer(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run ``execute`` on an idle instance; see :class:`ModelRuntime`.

        Raises what ``execute`` raised if it is a ``ZeroserveError``, otherwise
        :class:`InternalError`, also when the result lacks an output or has a wrong dtype.
        """
        pool, executor = self._pool, self._executor
        if self.state is not RuntimeState.READY or pool is None or executor is None:
            raise ModelNotReadyError(f"model '{self.name}' version {self.version} is not ready")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(executor, pool.run, batch)

    def _forget_engine(self) -> None:
        self._pool = None

    def _free_engine(self) -> None:
        """Finalize every instance and forget the module."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close(self.name)
        del pool
        metrics, self._metrics = self._metrics, None
        if metrics is not None:
            metrics.close()
        gc.collect()

    def _load_sync(
        self, model_dir: Path, config: mc.ModelConfig, device: str, count: int
    ) -> _InstancePool:
        match = _DEVICE.fullmatch(device)
        if match is None:
            raise self._load_error(f"unknown device {device!r}; expected 'cpu' or 'cuda:N'")
        path = model_file(
            model_dir, config.default_model_filename or self.model_filename, model=self.name
        )
        if not path.is_file():
            raise self._load_error(f"{path} does not exist")
        module_name = f"_zeroserve_model_{uuid.uuid4().hex}"
        model_class = self._import(path, module_name)
        # Triton's JSON form (defaults printed, int64 fields as numbers), as /config shows it.
        config_json = json.dumps(model_config.to_json(config))
        instances: list[Any] = []
        try:
            for index in range(count):
                instance = model_class()
                if not callable(getattr(instance, "execute", None)):
                    raise self._load_error(f"{MODEL_CLASS_NAME} in {path.name} has no execute()")
                initialize = getattr(instance, "initialize", None)
                if callable(initialize):
                    initialize(
                        {
                            "model_config": config_json,
                            "model_name": self.name,
                            "model_version": str(self.version),
                            "model_instance_kind": "CPU" if match.group(1) is None else "GPU",
                            "model_instance_name": f"{self.name}_{index}",
                            "model_instance_device_id": match.group(1) or "0",
                            "model_repository": str(model_dir.parent),
                        }
                    )
                instances.append(instance)
        except BaseException as exc:
            _InstancePool(module_name, tuple(instances), ()).close(self.name)
            if isinstance(exc, ModelLoadError):
                raise
            if isinstance(exc, Exception):
                raise self._load_error(
                    f"initializing {MODEL_CLASS_NAME} raised {type(exc).__name__}: {exc}"
                ) from exc
            raise
        outputs = tuple(
            _Output(o.name, datatypes.protocol_from_config(o.data_type)) for o in config.output
        )
        # A sequence model's state outputs go back to the batcher; a model may leave them
        # out (its state then stays as it was).
        outputs += tuple(
            _Output(o.name, datatypes.protocol_from_config(o.data_type), is_optional=True)
            for o in sequence_outputs(config)
        )
        return _InstancePool(module_name, tuple(instances), outputs)

    def _import(self, path: Path, module_name: str) -> type:
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise self._load_error(f"cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        # Registered so that dataclasses, typing and pickle, which look a class's module up
        # by name, work inside model.py; removed again at unload.
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
            model_class = getattr(module, MODEL_CLASS_NAME, None)
            if not isinstance(model_class, type):
                raise self._load_error(f"{path.name} does not define class {MODEL_CLASS_NAME}")
        except BaseException as exc:
            sys.modules.pop(module_name, None)
            if isinstance(exc, Exception) and not isinstance(exc, ModelLoadError):
                raise self._load_error(
                    f"importing {path.name} raised {type(exc).__name__}: {exc}"
                ) from exc
            raise
        return model_class

    def _load_error(self, reason: str) -> ModelLoadError:
        return ModelLoadError(model=self.name, reason=reason)


class _MetricsHost:
    """An in-process model's metric objects' way to the server's custom metrics."""

    def __init__(self, metrics: CustomMetrics | None, instance: str) -> None:
        self._metrics = metrics
        self._owner = metrics.new_owner() if metrics is not None else 0
        self._instance = instance
        self._deleted: collections.deque[int] = collections.deque()

    def metric_call(self, operation: str, arguments: dict[str, Any]) -> float:
        self._delete_pending()
        try:
            if self._metrics is None:
                raise MetricError("custom metrics are not offered by this server")
            return run_operation(self._metrics, self._owner, operation, arguments)
        except MetricError as exc:
            raise pb_utils.TritonModelException(
                f"Failed to process the request for model '{self._instance}', "
                f"message: {exc.message}"
            ) from None

    def metric_delete(self, handle: int) -> None:
        # Runs from __del__, maybe while this thread holds the store's lock: a deque's
        # append takes none; the deletion happens at the next operation.
        self._deleted.append(handle)

    def _delete_pending(self) -> None:
        metrics = self._metrics
        with contextlib.suppress(IndexError):
            while True:
                handle = self._deleted.popleft()
                if metrics is not None:
                    metrics.delete(handle)

    def close(self) -> None:
        """Delete everything the model created (it is unloaded)."""
        self._deleted.clear()
        if self._metrics is not None:
            self._metrics.drop_owner(self._owner)


@dataclass(frozen=True)
class _Output:
    name: str
    datatype: str
    is_optional: bool = False


class _InstancePool:
    """Initialized model instances, each lent to one thread at a time."""

    def __init__(
        self, module_name: str, instances: Sequence[Any], outputs: Sequence[_Output]
    ) -> None:
        self.module_name = module_name
        self.instances = tuple(instances)
        self.outputs = tuple(outputs)
        self._idle: queue.Queue[Any] = queue.Queue(maxsize=len(self.instances))
        for instance in self.instances:
            self._idle.put_nowait(instance)

    def run(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Borrow an instance, run ``execute`` and check the result (on a worker thread)."""
        # The executor has as many threads as there are instances, so one is always idle
        # here; an empty queue would mean that invariant broke.
        try:
            instance = self._idle.get_nowait()
        except queue.Empty:
            raise InternalError(
                "no idle Python model instance; more workers than instances"
            ) from None
        try:
            result = instance.execute(dict(batch))
        except ZeroserveError:
            raise
        except Exception as exc:
            raise InternalError(
                f"Python model execute() raised {type(exc).__name__}: {exc}"
            ) from exc
        finally:
            self._idle.put_nowait(instance)
        return self._check(result)

    def _check(self, result: Any) -> dict[str, np.ndarray]:
        if not isinstance(result, Mapping):
            raise InternalError(
                f"Python model execute() returned {type(result).__name__}, not a dict of arrays"
            )
        outputs = self.outputs or tuple(_Output(str(name), "") for name in result)
        checked: dict[str, np.ndarray] = {}
        for output in outputs:
            if output.name not in result:
                if output.is_optional:
                    continue
                raise InternalError(f"Python model execute() returned no output {output.name!r}")
            checked[output.name] = _as_output(output, np.asarray(result[output.name]))
        return checked

    def close(self, model: str) -> None:
        """Finalize every instance and drop the module from ``sys.modules``."""
        for instance in self.instances:
            finalize = getattr(instance, "finalize", None)
            if not callable(finalize):
                continue
            try:
                finalize()
            except Exception:
                # Unload must free the rest even if one instance's cleanup fails.
                logger.exception(
                    "finalize() of Python model %s failed", model, extra={"model": model}
                )
        self.instances = ()
        sys.modules.pop(self.module_name, None)


def _close_abandoned(future: Future[_InstancePool], *, model: str) -> None:
    """Finalize the instances of a load whose caller stopped waiting (cancelled)."""
    if not future.cancelled() and future.exception() is None:
        future.result().close(model)


def _as_output(output: _Output, array: np.ndarray) -> np.ndarray:
    if output.datatype == "BYTES" or (not output.datatype and array.dtype.kind in "USO"):
        if array.dtype.kind == "U":
            encoded = [item.encode("utf-8") for item in array.reshape(-1).tolist()]
            return np.array(encoded, dtype=object).reshape(array.shape)
        if array.dtype.kind == "S":
            return array.astype(object)
        if array.dtype.kind == "O":
            return array
    elif not output.datatype or array.dtype == datatypes.NUMPY_DTYPES[output.datatype]:
        return array
    raise InternalError(
        f"Python model output {output.name!r} has dtype {array.dtype}; "
        f"the config says {output.datatype}"
    )
