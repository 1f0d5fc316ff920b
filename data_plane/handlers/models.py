"""Per-model reads: metadata, readiness, configuration and statistics.

``version`` None means the model's highest serving version, as in the protocol's paths
without ``/versions/{v}``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from data_plane.errors import (
    InvalidArgumentError,
    ModelNotReadyError,
    NotFoundError,
    UnknownModelError,
)
from data_plane.repository import LoadedVersion, ModelRepository, TensorSpec
from data_plane.stats import ModelStats
from foundation.proto.model_config_pb2 import ModelConfig


@dataclass(frozen=True, slots=True)
class TensorMetadata:
    """One input or output as model metadata shows it: the shape includes the batch
    dimension (-1) when the model batches."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    """The Open Inference Protocol's model metadata."""

    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorMetadata, ...]
    outputs: tuple[TensorMetadata, ...]


@dataclass(frozen=True, slots=True)
class VersionStats:
    """One serving version's statistics (live counters, read when encoded)."""

    name: str
    version: int
    stats: ModelStats


class ModelHandlers:
    """Answers about one model, whatever the transport.

    Lookups raise what :meth:`ModelRepository.get` raises: UnknownModelError,
    NotFoundError, ModelNotReadyError.
    """

    def __init__(self, repository: ModelRepository) -> None:
        self._repository = repository

    def metadata(self, name: str, version: int | None = None) -> ModelMetadata:
        """The metadata of one version; without a version, its ``versions`` lists every
        serving version of the model."""
        model = self._repository.get(name, version)
        if version is None:
            versions = tuple(str(m.version) for m in self._repository.serving_versions(name))
        else:
            versions = (str(model.version),)
        batch = (-1,) if model.max_batch_size > 0 else ()
        return ModelMetadata(
            name=model.name,
            versions=versions,
            platform=model.config.platform or model.config.backend,
            inputs=_tensors(model.inputs.values(), batch),
            outputs=_tensors(model.outputs.values(), batch),
        )

    def ready(self, name: str, version: int | None = None) -> bool:
        """Whether the version serves: False while it is not ready (loading, unloading,
        asleep) and for a model or version the server does not have, as Triton answers."""
        try:
            self._repository.get(name, version)
        except (ModelNotReadyError, NotFoundError):
            return False
        return True

    def config(self, name: str, version: int | None = None) -> ModelConfig:
        """The version's complete configuration (defaults filled in at load). Do not change
        it: it is the serving version's own."""
        return self._repository.get(name, version).config

    def stats(self, name: str | None = None, version: int | None = None) -> list[VersionStats]:
        """Statistics of every serving version (``name`` None), of every serving version of
        ``name``, or of one version.

        Raises InvalidArgumentError with Triton's texts when the model or version is not
        available, as Triton's statistics extension does (not UnknownModelError).
        """
        models: list[LoadedVersion]
        if name is None:
            models = list(self._repository.all_serving())
        else:
            try:
                models = (
                    [self._repository.get(name, version)]
                    if version is not None
                    else self._repository.serving_versions(name)
                )
            except UnknownModelError:
                raise InvalidArgumentError(f"requested model '{name}' is not available") from None
            except NotFoundError:
                raise InvalidArgumentError(
                    f"requested model version is not available for model '{name}'"
                ) from None
            if not models:
                raise InvalidArgumentError(f"requested model '{name}' is not available")
        return [VersionStats(name=m.name, version=m.version, stats=m.stats) for m in models]


def _tensors(specs: Iterable[TensorSpec], batch: tuple[int, ...]) -> tuple[TensorMetadata, ...]:
    return tuple(
        TensorMetadata(name=s.name, datatype=s.datatype, shape=batch + s.dims) for s in specs
    )
