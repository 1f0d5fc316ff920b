"""The records of the model repository: a serving version, its tensors, the index's rows and
its states, and what a load reports. ``data_plane.repository`` re-exports them."""

from __future__ import annotations

import enum
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from data_plane.batcher import Batcher
from data_plane.instances import Instances
from data_plane.protocol import InferRequest, OutputTensor
from data_plane.reshape import TensorReshape
from data_plane.response_cache import ModelResponseCache
from data_plane.response_stream import ResponseStream
from data_plane.sequence import SequenceBatcher
from data_plane.stats import ComputeTimes, ModelStats
from foundation.proto.model_config_pb2 import ModelConfig
from runtimes.base import ModelRuntime
from runtimes.capabilities import Capabilities
from runtimes.model_request import StreamedResponse


class VersionState(enum.StrEnum):
    """Triton's model version states, as the repository index reports them."""

    UNKNOWN = "UNKNOWN"
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    LOADING = "LOADING"
    UNLOADING = "UNLOADING"
    SLEEPING = "SLEEPING"
    """Not a Triton state: loaded, asleep, out of service until woken (LLM engines)."""


UNLOADED = "unloaded"
"""The reason an UNAVAILABLE version gives when it was unloaded on purpose (Triton's)."""


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One configured input or output, in protocol terms (its ``dims``, as clients see it)."""

    name: str
    datatype: str
    dims: tuple[int, ...]
    optional: bool = False
    labels: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One row of the repository index: a model version the server knows, or (``version``
    None) a model it has only seen in the repository."""

    name: str
    version: int | None = None
    state: VersionState | None = None
    reason: str = ""
    """Why the version is in its state (a failed load's error, ``unloaded``), or empty."""


@dataclass(frozen=True, slots=True)
class FetchReport:
    """Where a load found the model's files: the node cache's answer for this load alone."""

    cache: str
    """``hit`` (the node cache held them), ``miss`` (they were downloaded) or ``local`` (a
    local folder, read in place: no cache involved)."""
    bytes_fetched: int
    """Bytes downloaded for this load (0 unless a miss)."""
    fetch_s: float
    """Seconds spent getting the files (listing and checking them, downloading on a miss)."""

    def to_json(self) -> dict[str, Any]:
        return {"cache": self.cache, "bytes_fetched": self.bytes_fetched, "fetch_s": self.fetch_s}


RunStep = Callable[["LoadedVersion", InferRequest, ComputeTimes], Awaitable[list[OutputTensor]]]
"""Runs one request on a model version as any infer request runs, adding its compute
times to the :class:`ComputeTimes` given (an ensemble's step)."""


OpenStep = Callable[["LoadedVersion", InferRequest, ComputeTimes], ResponseStream]
"""Opens the responses of a decoupled model version to one request (a decoupled
ensemble's step), adding its compute times to the :class:`ComputeTimes` given."""


class Pipeline(Protocol):
    """What runs an ensemble version's requests, in place of a batcher and an engine
    (:class:`data_plane.ensemble.Ensemble`)."""

    async def run(
        self,
        inputs: Mapping[str, np.ndarray],
        request: InferRequest,
        run_step: RunStep,
        times: ComputeTimes,
    ) -> dict[str, np.ndarray]:
        """Run ``request`` (its ``inputs`` checked against the config) through the
        steps, each through ``run_step``; the outputs by name."""
        ...

    def stream(
        self,
        inputs: Mapping[str, np.ndarray],
        request: InferRequest,
        run_step: RunStep,
        open_step: OpenStep,
        times: ComputeTimes,
    ) -> AsyncGenerator[StreamedResponse, None]:
        """A decoupled ensemble's responses to ``request``: each step through
        ``run_step``, or ``open_step`` where its model is decoupled."""
        ...


@dataclass
class LoadedVersion:
    """One model version that is serving (or draining): engines, batcher and counters."""

    name: str
    version: int
    config: ModelConfig
    instances: Instances
    """Its runtimes (one per device its instance groups name) and their instances."""
    capabilities: Capabilities
    """What the runtime offers beyond infer (text generation, sleep, ...), asked once at load."""
    batcher: Batcher | SequenceBatcher
    """The dynamic batcher, or the sequence batcher of a ``sequence_batching`` model."""
    stats: ModelStats
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    load_duration_s: float
    reshape: TensorReshape | None = None
    """The config's ``reshape``s, applied between clients' shapes and the engine's."""
    ensemble: Pipeline | None = None
    """An ensemble's steps: its requests run through them, not through the batcher."""
    response_cache: ModelResponseCache | None = None
    """Its way into the server's response cache, when its config enables the cache and the
    server has one."""

    @property
    def runtime(self) -> ModelRuntime:
        """The runtime of the first device (the only one, unless the instance groups name
        several): the one that answers for the engine."""
        return self.instances.primary

    @property
    def max_batch_size(self) -> int:
        return self.config.max_batch_size
