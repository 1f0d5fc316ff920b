"""What every route sees: built in the app's lifespan, reached through ``request.state``
(``scope["state"]`` in pure ASGI)."""

from __future__ import annotations

from typing import TypedDict

from data_plane.handlers import Handlers
from data_plane.metrics import Metrics
from data_plane.repository import ModelRepository
from data_plane.settings import DataPlaneSettings
from data_plane.state import Lifecycle


class ServerState(TypedDict):
    """The lifespan state every route sees."""

    settings: DataPlaneSettings
    repository: ModelRepository
    metrics: Metrics
    lifecycle: Lifecycle
    handlers: Handlers
