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
    ├── CredentialsError              zeroserve.credentials: the command line's stored
    │                                 admin URL and token cannot be read or written
    └── ModelFailedError              here: the model's load failed for good; raised by the
                                      control plane, answered by the activator (both map it)

Each branch is free of HTTP and each app maps its branch to status codes in one
``http_errors.py``, by class (the nearest mapped class in the error's MRO) and typed
fields such as ``retry_after_s``, never by message text. ``zeroserve up`` runs the
activator and the control plane in one process: ``except ZeroserveError`` catches every
component's errors there. No two branches define a class of the same name.
"""

from __future__ import annotations

__all__ = ["ModelFailedError", "ZeroserveError"]


class ZeroserveError(Exception):
    """Base of every error zeroserve raises on purpose; ``message`` is what a client reads."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ModelFailedError(ZeroserveError):
    """``model`` cannot be served until its registration changes or it is loaded on
    purpose: its last load failed for good (``reason``, the worker's words, at
    ``failed_at``, wall-clock seconds). Retrying the request is no use, so it is answered
    at once, with a status clients do not retry.

    Shared by the control plane, which raises it, and the activator, which answers it:
    the two do not import each other.
    """

    def __init__(self, *, model: str, reason: str, failed_at: float) -> None:
        super().__init__(
            f"model '{model}' failed to load and is not retried until its registration "
            f"changes or it is loaded again (zeroserve models load {model}): {reason}"
        )
        self.model = model
        self.reason = reason
        self.failed_at = failed_at
