"""The server's lifecycle and model control mode, shared by the handlers and the app."""

from __future__ import annotations

from data_plane.settings import DataPlaneSettings, ModelControlMode

# The one Lifecycle every server shares, named here for the data plane's modules.
from foundation.serving import Lifecycle

__all__ = ["Lifecycle", "is_explicit"]


def is_explicit(settings: DataPlaneSettings) -> bool:
    """Whether ``settings`` allow model control (load, unload, sleep, wake)."""
    return settings.model_control_mode is ModelControlMode.EXPLICIT
