"""What the activator says about itself as a server, on HTTP (``GET /v2``) and gRPC
(ServerMetadata) alike."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["EXTENSIONS", "SERVER_NAME", "server_version"]

SERVER_NAME = "triton"
"""Triton's default server name, which its clients and examples check; the version says
which zeroserve answers."""

EXTENSIONS = (
    "classification",
    "schedule_policy",
    "model_configuration",
    "binary_tensor_data",
    "parameters",
    "statistics",
)
"""Triton's names for the extensions the workers behind the activator offer on model paths
(the repository extension is the control plane's business, not the public endpoint's)."""


def server_version() -> str:
    """The installed zeroserve's version ("0.0.0" when run from a source tree)."""
    try:
        return version("zeroserve")
    except PackageNotFoundError:
        return "0.0.0"
