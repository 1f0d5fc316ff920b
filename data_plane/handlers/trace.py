"""Trace settings: the server's, or one model's, read and changed whatever the transport.

Transports parse the values from their wire format with `data_plane.trace`'s parsers
(which give Triton's texts) and pass a `TraceUpdate`; a model must be ready to have its
setting read or changed, as in Triton.
"""

from __future__ import annotations

from data_plane.errors import DataPlaneError, InvalidArgumentError
from data_plane.repository import ModelRepository
from data_plane.trace import TraceManager, TraceUpdate, TraceValues


class TraceHandler:
    """Reads and changes trace settings over one server's trace manager."""

    def __init__(self, manager: TraceManager, repository: ModelRepository) -> None:
        self._manager = manager
        self._repository = repository

    def check_model(self, model: str | None) -> None:
        """Raise InvalidArgumentError, Triton's "Request for unknown model", unless
        ``model`` is None (the server's setting) or has a version serving."""
        if model is None:
            return
        try:
            self._repository.get(model)
        except DataPlaneError:
            raise InvalidArgumentError(f"Request for unknown model : {model}") from None

    def settings(self, model: str | None = None) -> TraceValues:
        """The setting in force for ``model`` (None: the server's)."""
        self.check_model(model)
        return self._manager.settings(model)

    def update(self, model: str | None, update: TraceUpdate) -> TraceValues:
        """Change ``model``'s setting (None: the server's); see `TraceManager.update`."""
        self.check_model(model)
        return self._manager.update(model, update)
