"""The data plane's errors: its branch of the tree (``runtimes.errors``, where the runtimes
raise the same kinds) named in one module, and the leaves only the data plane raises.

The data plane's modules and model code (a ``model.py`` raising ``InvalidArgumentError``)
import every data-plane error from here; the tree, with where each class lives, is drawn
in ``runtimes.errors``. ``data_plane.http_errors`` maps each class to a status code.
"""

from __future__ import annotations

from typing import ClassVar

from foundation.errors import ZeroserveError
from runtimes.errors import (
    ContextLengthError,
    DataPlaneError,
    EngineDeadError,
    InternalError,
    InvalidArgumentError,
    InvalidParameterError,
    ModelLoadError,
    ModelNotReadyError,
    NotFoundError,
    QueueFullError,
    UnavailableError,
    UnsupportedError,
    request_prefix,
)

__all__ = [
    "ContextLengthError",
    "DataPlaneError",
    "EngineDeadError",
    "InternalError",
    "InvalidArgumentError",
    "InvalidParameterError",
    "ModelLoadError",
    "ModelNotReadyError",
    "ModelPollError",
    "ModelStorageUnavailableError",
    "NotFoundError",
    "QueueFullError",
    "RequestTimeoutError",
    "ServerStoppingError",
    "UnavailableError",
    "UnknownModelError",
    "UnsupportedCompressionError",
    "UnsupportedError",
    "ZeroserveError",
    "request_prefix",
]


class UnknownModelError(NotFoundError):
    """The server knows no model of this name (Triton's NOT_FOUND: 404 over HTTP)."""

    def __init__(self, *, model: str) -> None:
        super().__init__(f"Request for unknown model: '{model}' is not found")
        self.model = model


class ModelPollError(ModelLoadError):
    """A load failed before any version was built: the model's folder or its configuration
    cannot be read or breaks a rule. Worded as Triton's "failed to poll from model
    repository", with the reason Triton only logs."""

    def __init__(self, *, model: str, reason: str) -> None:
        DataPlaneError.__init__(
            self, f"failed to load '{model}', failed to poll from model repository: {reason}"
        )
        self.model = model
        self.reason = reason


class ModelStorageUnavailableError(UnavailableError, ModelPollError):
    """A load failed because the model's store could not be read now (unreachable, slow)
    or the node cache could not make room: a retry later may succeed, so it is answered
    as unavailable (503), not as a load the model itself fails."""

    retry_after_s = 5

    def __init__(self, *, model: str, reason: str) -> None:
        ModelPollError.__init__(self, model=model, reason=reason)


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


class UnsupportedCompressionError(UnsupportedError):
    """The request body's ``Content-Encoding`` is not one the server decodes; the answer
    advertises ``accepted_encodings`` (``Accept-Encoding``)."""

    accepted_encodings: ClassVar[tuple[str, ...]] = ("gzip", "deflate")

    def __init__(self, *, encoding: str) -> None:
        super().__init__("Unsupported compression type")
        self.encoding = encoding
