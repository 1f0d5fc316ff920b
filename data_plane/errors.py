"""The data plane's error tree, free of HTTP.

    ZeroserveError
    ├── InvalidArgumentError          the request is wrong (Triton INVALID_ARG)
    │   └── UnknownModelError         a name the repository has never heard of
    ├── NotFoundError                 a known model without the version asked for
    ├── UnavailableError              try again later (Triton UNAVAILABLE)
    │   ├── ModelNotReadyError        loading, unloading or failed
    │   ├── QueueFullError            the batcher's queue for a priority level is full
    │   ├── RequestTimeoutError       the request waited in the queue past its timeout
    │   └── ServerStoppingError       the server is draining for shutdown
    ├── UnsupportedError              a feature we do not offer (Triton UNSUPPORTED)
    ├── ModelLoadError                a load failed; the model stays unloaded
    └── InternalError                 an engine failed while running a batch

`data_plane.http_errors` maps each class to a status code in one place. Messages follow the
texts Triton gives so that tools matching on them keep working.
"""

from __future__ import annotations


class ZeroserveError(Exception):
    """Base of every error the data plane raises on purpose."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgumentError(ZeroserveError):
    """The request cannot be served as written: bad JSON, shape, datatype or parameter."""


class UnknownModelError(InvalidArgumentError):
    """The repository holds no model of this name (Triton answers 400 here, not 404)."""

    def __init__(self, *, model: str) -> None:
        super().__init__(f"Request for unknown model: '{model}' is not found")
        self.model = model


class NotFoundError(ZeroserveError):
    """A known model has no available version matching the request."""


class UnavailableError(ZeroserveError):
    """The server cannot serve this now; a retry later may succeed."""

    retry_after_s: int = 1


class ModelNotReadyError(UnavailableError):
    """The model version exists but is not READY (loading, unloading, failed)."""


class QueueFullError(UnavailableError):
    """The batcher queue of the request's priority level is at ``max_queue_size``."""

    def __init__(self, *, request_id: str | None = None) -> None:
        super().__init__(f"{request_prefix(request_id)}Exceeds maximum queue size")


class RequestTimeoutError(UnavailableError):
    """The request's queue timeout expired before it was placed in a batch."""

    def __init__(self, *, request_id: str | None = None) -> None:
        super().__init__(f"{request_prefix(request_id)}Request timeout expired")


class ServerStoppingError(UnavailableError):
    """The server is shutting down and takes no new inference requests."""

    def __init__(self) -> None:
        super().__init__(
            "Server is stopping, scheduler for model has stopped accepting new inference requests"
        )


class UnsupportedError(ZeroserveError):
    """The request asks for something this server does not implement."""


class ModelLoadError(ZeroserveError):
    """Loading a model failed; the message says why and the model stays unloaded."""

    def __init__(self, *, model: str, reason: str) -> None:
        super().__init__(f"load failed for model '{model}': {reason}")
        self.model = model
        self.reason = reason


class InternalError(ZeroserveError):
    """The engine failed while executing a batch."""


def request_prefix(request_id: str | None) -> str:
    """Triton's prefix for request-scoped errors: ``[request id: <id>] ``."""
    return f"[request id: {request_id or '<id_unknown>'}] "
