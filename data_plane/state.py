"""What request handlers share: built in the app's lifespan, reached through ``request.state``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from data_plane.metrics import Metrics
from data_plane.repository import ModelRepository
from data_plane.settings import DataPlaneSettings, ModelControlMode


@dataclass
class Lifecycle:
    """Whether the server is draining for shutdown (readiness fails first, then requests)."""

    is_stopping: bool = False


class ServerState(TypedDict):
    """The lifespan state every handler sees."""

    settings: DataPlaneSettings
    repository: ModelRepository
    metrics: Metrics
    lifecycle: Lifecycle


def is_explicit(settings: DataPlaneSettings) -> bool:
    return settings.model_control_mode is ModelControlMode.EXPLICIT
