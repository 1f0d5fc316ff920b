"""The one root of every error zeroserve raises on purpose, and where each branch lives.

    ZeroserveError                    here
    ├── DataPlaneError                runtimes.errors: Triton's error kinds, raised by the
    │                                 runtimes and the data plane alike (data_plane.errors
    │                                 adds the data plane's own leaves, storage.errors its
    │                                 storage failures)
    ├── ActivatorError                activator.errors
    ├── ControlPlaneError             control_plane.errors (backends.knative.errors adds
    │                                 the Kubernetes failures)
    ├── ServerStartError              foundation.serving: a server process's listener did
    │                                 not come up (the command line's exit status 3)
    └── CredentialsError              zeroserve.credentials: the command line's stored
                                      admin URL and token cannot be read or written

Each branch is free of HTTP and each app maps its branch to status codes in one
``http_errors.py``, by class (the nearest mapped class in the error's MRO) and typed
fields such as ``retry_after_s``, never by message text. ``zeroserve up`` runs the
activator and the control plane in one process: ``except ZeroserveError`` catches every
component's errors there. No two branches define a class of the same name.
"""

from __future__ import annotations

__all__ = ["ZeroserveError"]


class ZeroserveError(Exception):
    """Base of every error zeroserve raises on purpose; ``message`` is what a client reads."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
