"""Server health and metadata: live, ready, the server's metadata and its metrics text."""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

from data_plane.metrics import Metrics
from data_plane.repository import ModelRepository
from data_plane.state import Lifecycle

SERVER_NAME = "triton"
"""The name server metadata gives unless the server is given another (Triton's ``--id``):
Triton's default, since Triton's clients and examples check it."""

EXTENSIONS = (
    "classification",
    "sequence",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
)
"""Triton's extension names for what this server implements, in Triton's order."""


@dataclass(frozen=True, slots=True)
class ServerMetadata:
    """The Open Inference Protocol's server metadata."""

    name: str
    version: str
    extensions: tuple[str, ...]


class ServerHandlers:
    """Answers about the server as a whole, whatever the transport; ``name`` is the one its
    metadata gives (Triton's ``--id``)."""

    def __init__(
        self,
        repository: ModelRepository,
        lifecycle: Lifecycle,
        metrics: Metrics,
        *,
        name: str = SERVER_NAME,
    ):
        self._repository = repository
        self._lifecycle = lifecycle
        self._metrics = metrics
        self._name = name

    def live(self) -> bool:
        """Whether the process serves at all: always, while it can answer."""
        return True

    def ready(self) -> bool:
        """Whether the server can serve now: not draining, and every start-up model serves
        (Triton's strict readiness; see :meth:`ModelRepository.is_ready`)."""
        return not self._lifecycle.is_stopping and self._repository.is_ready()

    def metadata(self) -> ServerMetadata:
        return ServerMetadata(name=self._name, version=_version(), extensions=EXTENSIONS)

    def metrics_text(self) -> bytes:
        """Every metric, serving models' included, in Prometheus text format 0.0.4."""
        return self._metrics.render(self._repository.all_serving())


def _version() -> str:
    try:
        return version("zeroserve")
    except PackageNotFoundError:
        return "0.0.0"
