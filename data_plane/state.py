"""The server's lifecycle and model control mode, shared by the handlers and the app."""

from __future__ import annotations

from dataclasses import dataclass

from data_plane.settings import DataPlaneSettings, ModelControlMode


@dataclass
class Lifecycle:
    """Whether the server is draining for shutdown (readiness fails first, then requests)."""

    is_stopping: bool = False


def is_explicit(settings: DataPlaneSettings) -> bool:
    """Whether ``settings`` allow model control (load, unload, sleep, wake)."""
    return settings.model_control_mode is ModelControlMode.EXPLICIT
