"""Triton's model repository extension (index, load, unload), and sleep and wake.

Load, unload, sleep and wake are model control: only in explicit mode, and only on the one
repository this server has (a request naming a repository is refused). Load and unload take
the request's ``parameters`` as a mapping of plain values (JSON's, or a gRPC parameter
map's), checked here with Triton's texts.

A load's ``allow_model_code`` parameter (a boolean, default true) is zeroserve's: false
refuses a model that is code (a Python-backend ``model.py``, a PyTorch program).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from data_plane.errors import (
    InvalidArgumentError,
    UnavailableError,
    UnknownModelError,
    UnsupportedError,
)
from data_plane.repository import FetchReport, IndexEntry, ModelRepository
from data_plane.sequence import SequenceBatcher


@dataclass(frozen=True, slots=True)
class LoadOptions:
    """What a load's parameters ask for."""

    config: str | None = None
    """A JSON model config replacing the stored one."""
    storage_uri: str | None = None
    """Where the model's files are, instead of the repository (an allowed root)."""
    allow_model_code: bool = True


def load_options(parameters: Mapping[str, object]) -> LoadOptions:
    """The load ``parameters`` checked; InvalidArgumentError for a wrong type or an unknown
    name."""
    config: str | None = None
    storage_uri: str | None = None
    allow_model_code = True
    for key, value in parameters.items():
        if key == "config":
            if not isinstance(value, str):
                raise InvalidArgumentError("Invalid config override: expected a JSON string")
            config = value
        elif key == "storage_uri":
            if not isinstance(value, str) or not value:
                raise InvalidArgumentError("Invalid storage_uri: expected a non-empty string")
            storage_uri = value
        elif key == "allow_model_code":
            if not isinstance(value, bool):
                raise InvalidArgumentError("Invalid allow_model_code: expected a boolean")
            allow_model_code = value
        else:
            raise InvalidArgumentError(
                f"Unrecognized load parameter '{key}' with type '{type(value).__name__}'"
            )
    return LoadOptions(config=config, storage_uri=storage_uri, allow_model_code=allow_model_code)


def _check_unload_parameters(parameters: Mapping[str, object]) -> None:
    # Triton's only unload parameter; there are no dependents (no ensembles) to unload.
    dependents = parameters.get("unload_dependents", False)
    if not isinstance(dependents, bool):
        raise InvalidArgumentError("Unable to parse 'unload_dependents': expected a boolean")


class RepositoryHandlers:
    """The model repository's index and model control, whatever the transport.

    ``is_explicit``: the server runs in explicit model control mode (model control is
    refused otherwise).
    """

    def __init__(self, repository: ModelRepository, *, is_explicit: bool) -> None:
        self._repository = repository
        self._is_explicit = is_explicit

    async def index(self, *, ready_only: bool = False) -> list[IndexEntry]:
        """Every model in the repository or known to the server, a row per known version;
        ``ready_only`` keeps the READY versions only."""
        return await self._repository.index(ready_only=ready_only)

    def check_control(self, repository_name: str | None = None) -> None:
        """Refuse model control outside explicit mode (UnavailableError) or on a named
        repository (UnsupportedError).

        The other methods check this themselves; a transport calls it first when it must
        refuse before reading the request.
        """
        if not self._is_explicit:
            # Triton gives this text in every non-explicit mode, 'none' included.
            raise UnavailableError(
                "explicit model load / unload is not allowed if polling is enabled"
            )
        if repository_name is not None:
            raise UnsupportedError("'repository_name' specification is not supported")

    async def load(
        self,
        name: str,
        parameters: Mapping[str, object] | None = None,
        *,
        repository_name: str | None = None,
    ) -> FetchReport:
        """Load (or reload) ``name``; returns once it serves, with where its files came
        from. Raises ModelLoadError when the load fails (see :meth:`ModelRepository.load`)."""
        self.check_control(repository_name)
        options = load_options(parameters or {})
        return await self._repository.load(
            name,
            config_override=options.config,
            storage_uri=options.storage_uri,
            allow_model_code=options.allow_model_code,
        )

    async def unload(
        self,
        name: str,
        parameters: Mapping[str, object] | None = None,
        *,
        repository_name: str | None = None,
    ) -> None:
        """Take ``name`` out of service, drain it and free its engine."""
        self.check_control(repository_name)
        _check_unload_parameters(parameters or {})
        await self._repository.unload(name)

    async def sleep(self, name: str, *, repository_name: str | None = None) -> None:
        """Put the engine of ``name`` to sleep (see :meth:`ModelRepository.sleep`)."""
        self.check_control(repository_name)
        await self._repository.sleep(name)

    async def wake(self, name: str, *, repository_name: str | None = None) -> None:
        """Put a sleeping ``name`` back in service (see :meth:`ModelRepository.wake`)."""
        self.check_control(repository_name)
        await self._repository.wake(name)

    def fetch_progress(self, name: str) -> tuple[int, int] | None:
        """(bytes downloaded, bytes needed) of the files of ``name`` for a load under way;
        None when no download of it runs."""
        progress = self._repository.fetch_progress(name)
        if progress is None:
            return None
        return progress.fetched_bytes, progress.total_bytes

    def live_sequences(self, name: str) -> int:
        """Sequences running on the serving versions of ``name`` (started and not yet ended
        by END or their idle limit, those waiting for a slot included); 0 when it serves
        none or is no sequence model. What the control plane asks before it takes a replica
        away for being idle or surplus: that would cut those sequences."""
        try:
            versions = self._repository.serving_versions(name)
        except UnknownModelError:
            return 0
        return sum(
            v.batcher.live_sequences for v in versions if isinstance(v.batcher, SequenceBatcher)
        )
