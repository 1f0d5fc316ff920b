"""Python models (``backend: "python"``, a ``model.py``), in either of two contracts.

Both define ``class TritonPythonModel`` in ``model.py``; which contract a model follows is
read from its source without running it (:mod:`runtimes.python_backend.contract`):

Triton's Python-backend contract
    ``import triton_python_backend_utils as pb_utils`` and ``execute(self, requests)``
    returning one ``pb_utils.InferenceResponse`` per request, as Triton documents it: the
    model runs unchanged, each instance in a stub process of its own
    (:class:`~runtimes.python_backend.runtime.StubRuntime`), so a crash, a leak or a
    held GIL stays in that process. The batcher hands ``execute`` the requests of a
    batch one by one. ``auto_complete_config``, ``EXECUTION_ENV_PATH`` and Triton's error
    texts are supported.
zeroserve's dict contract (the fast path)
    ``execute(self, inputs)`` taking one merged batch as a dict of arrays and returning
    one, run in the server's process with no process boundary
    (:class:`~runtimes.python_backend.inprocess.InProcessRuntime`), for trusted code
    where the last microseconds matter.

:class:`PythonRuntime` is the runtime registered for the ``python`` backend; it picks the
contract at load and delegates everything to the runtime of that contract.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from foundation.proto import model_config_pb2 as mc
from runtimes.base import ModelRuntime, RuntimeOptions, RuntimeState, model_file
from runtimes.capabilities import Capabilities
from runtimes.errors import ModelNotReadyError
from runtimes.python_backend import complete, contract
from runtimes.python_backend.inprocess import InProcessRuntime
from runtimes.python_backend.runtime import StubRuntime

__all__ = ["PythonRuntime"]


class PythonRuntime(ModelRuntime):
    """A ``model.py`` under Triton's contract (stub processes) or zeroserve's dict
    contract (in process); see the module docstring.

    Thread-safety: as the runtime it delegates to; :meth:`infer` may be awaited
    concurrently up to the instance count.
    """

    kind = "python"
    model_filename = "model.py"

    def __init__(self, *, name: str, version: int, options: RuntimeOptions) -> None:
        self._engine: ModelRuntime | None = None
        super().__init__(name=name, version=version, options=options)

    @property
    def state(self) -> RuntimeState:
        """The state of the runtime it delegates to, once chosen."""
        return self._engine.state if self._engine is not None else self._state

    @state.setter
    def state(self, value: RuntimeState) -> None:
        self._state = value

    @classmethod
    def complete_config(cls, version_dir: Path, config: mc.ModelConfig) -> None:
        """Run a Triton model's ``auto_complete_config`` (in a stub of its own)."""
        path = version_dir / (config.default_model_filename or cls.model_filename)
        if path.is_file() and contract.follows_triton_contract(path, config):
            complete.auto_complete(path, config, model=config.name)

    async def load(self, model_dir: Path, config: mc.ModelConfig, device: str) -> None:
        """Choose the contract from ``model.py``'s source, then load it that way.

        Raises what the chosen runtime raises (:class:`ModelLoadError`).
        """
        if self._engine is not None or self._state is not RuntimeState.NEW:
            raise RuntimeError(f"load() called on a runtime in state {self.state.value}")
        path = model_file(
            model_dir, config.default_model_filename or self.model_filename, model=self.name
        )
        is_triton = path.is_file() and await asyncio.to_thread(
            contract.follows_triton_contract, path, config
        )
        runtime = StubRuntime if is_triton else InProcessRuntime
        self._engine = runtime(name=self.name, version=self.version, options=self.options)
        await self._engine.load(model_dir, config, device)

    async def infer(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one merged batch; see :class:`ModelRuntime`."""
        engine = self._engine
        if engine is None:
            raise ModelNotReadyError(f"model '{self.name}' version {self.version} is not ready")
        return await engine.infer(batch)

    async def unload(self) -> None:
        """Unload what was loaded; idempotent."""
        if self._engine is None:
            self._state = RuntimeState.UNLOADED
            return
        await self._engine.unload()

    def resolve_capabilities(self) -> Capabilities:
        """The chosen runtime's capabilities (separate requests and failure reports for
        Triton's contract)."""
        if self._engine is None:
            return Capabilities()
        return self._engine.resolve_capabilities()
