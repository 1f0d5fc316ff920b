"""The data plane's operations, free of any transport: used by the HTTP routes (and by
every other transport the server gets), which only decode requests and encode answers.

Each handler takes and returns plain objects (the protocol's dataclasses, the ModelConfig
proto, the repository's records) and raises the data plane's errors; mapping those to a
transport's statuses is the transport's job.

Modules: `server` (health, metadata, metrics), `models` (per-model metadata, readiness,
config, statistics), `infer`, `repository` (index, load, unload, sleep, wake), `generate`
(Triton's generate extension on LLMs), `shared_memory` (the shared-memory registries, which
every transport of one server shares through ``Handlers.shared_memory``), `trace` (trace
settings, over `data_plane.trace`). The logging settings' handler is
`data_plane.log_settings.LogControl` itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from data_plane.handlers.generate import GenerateHandler
from data_plane.handlers.infer import InferHandler
from data_plane.handlers.models import ModelHandlers
from data_plane.handlers.repository import RepositoryHandlers
from data_plane.handlers.server import SERVER_NAME, ServerHandlers
from data_plane.handlers.shared_memory import SharedMemoryHandlers
from data_plane.handlers.trace import TraceHandler
from data_plane.log_settings import LogControl
from data_plane.metrics import Metrics
from data_plane.repository import ModelRepository
from data_plane.shared_memory import CudaSharedMemory, SystemSharedMemory
from data_plane.state import Lifecycle
from data_plane.trace import TraceConfig, TraceManager


@dataclass(frozen=True, slots=True)
class Handlers:
    """Every handler of one server, over the same repository and lifecycle.

    Built once per server and shared by all its transports (HTTP, gRPC): the shared-memory
    regions registered through one are used by infer requests through any other.
    """

    server: ServerHandlers
    models: ModelHandlers
    infer: InferHandler
    repository: RepositoryHandlers
    generate: GenerateHandler
    shared_memory: SharedMemoryHandlers
    trace: TraceHandler
    logging: LogControl

    @classmethod
    def create(
        cls,
        repository: ModelRepository,
        lifecycle: Lifecycle,
        metrics: Metrics,
        *,
        is_explicit: bool,
        tracing: TraceManager | None = None,
        log_control: LogControl | None = None,
        server_id: str = SERVER_NAME,
    ) -> Handlers:
        """The handlers of a server serving ``repository``; ``is_explicit``: model control
        (load, unload, sleep, wake) is allowed. ``tracing`` and ``log_control`` are the
        server's; its owner closes ``tracing`` (the last writes are awaited) and :meth:`close`
        puts the logging back. By default tracing cannot be turned on (no trace file) and
        logging is the process's root logger's."""
        tracing = tracing or TraceManager(TraceConfig())
        shared_memory = SharedMemoryHandlers(SystemSharedMemory(), CudaSharedMemory())
        return cls(
            server=ServerHandlers(repository, lifecycle, metrics, name=server_id),
            models=ModelHandlers(repository),
            infer=InferHandler(repository, lifecycle, shared_memory, tracing),
            repository=RepositoryHandlers(repository, is_explicit=is_explicit),
            generate=GenerateHandler(repository, lifecycle),
            shared_memory=shared_memory,
            trace=TraceHandler(tracing, repository),
            logging=log_control or LogControl(),
        )

    def close(self) -> None:
        """Let go of what the handlers hold beyond the repository: every shared-memory region
        (the server stops; requests still using one finish with it first), and the logging
        as it was before any logging settings were changed."""
        self.shared_memory.close()
        self.logging.close()


__all__ = [
    "GenerateHandler",
    "Handlers",
    "InferHandler",
    "ModelHandlers",
    "RepositoryHandlers",
    "ServerHandlers",
    "SharedMemoryHandlers",
    "TraceHandler",
]
