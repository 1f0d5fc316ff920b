"""The runtime an ensemble version holds in a model version's place for an engine.

An ensemble has no engine: its requests run through :class:`Ensemble`, which calls the
composing models, and never reach a runtime's :meth:`infer`. This runtime gives the
version what every version has (a state, a kind for the index and the metrics, an unload
that lets accepted requests finish) and refuses batches.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from data_plane.ensemble.scheduler import Ensemble
from data_plane.errors import InternalError
from foundation.ensemble_config import ENSEMBLE_PLATFORM
from foundation.proto.model_config_pb2 import ModelConfig
from runtimes.base import ModelRuntime, RuntimeOptions, RuntimeState

logger = logging.getLogger(__name__)


class EnsembleRuntime(ModelRuntime):
    """Stands for ``ensemble`` in its version; :meth:`unload` waits (up to the drain
    timeout of ``options``) for the ensemble's requests in flight."""

    kind = ENSEMBLE_PLATFORM
    model_filename = ""

    def __init__(
        self, ensemble: Ensemble, *, name: str, version: int, options: RuntimeOptions
    ) -> None:
        super().__init__(name=name, version=version, options=options)
        self.ensemble = ensemble

    async def load(self, model_dir: Path, config: ModelConfig, device: str) -> None:
        """Nothing to build: the composing models are loaded on their own."""
        self.state = RuntimeState.READY

    async def infer(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Never called: inference runs an ensemble's requests through its steps."""
        raise InternalError(f"ensemble '{self.name}' runs its steps, not batches")

    async def unload(self) -> None:
        """Let the requests going through the steps finish, within the drain timeout."""
        if self.state is RuntimeState.UNLOADED:
            return
        self.state = RuntimeState.UNLOADING
        timeout_s = self.options.drain_timeout_s
        if not await self.ensemble.wait_idle(timeout_s):
            logger.warning(
                "ensemble %s unloaded with %d request(s) still running after %s s",
                self.name,
                self.ensemble.running_count,
                timeout_s,
            )
        self.state = RuntimeState.UNLOADED
