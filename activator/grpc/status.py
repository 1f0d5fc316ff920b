"""The one place where the activator's errors become gRPC statuses.

The codes are those HTTP's statuses map to in gRPC's own table (gRPC's "HTTP to gRPC status
code mapping"), except where Triton's gRPC front end answers otherwise: an unregistered
model is NOT_FOUND with Triton's text. A full buffer is UNAVAILABLE, not HTTP's 429: it is
the code gRPC clients and retry policies treat as "try again", and RESOURCE_EXHAUSTED is
what gRPC itself answers for a message over the size limit, which no retry cures. A key
over its quota is RESOURCE_EXHAUSTED (gRPC's own meaning: "some resource has been
exhausted, perhaps a per-user quota"), with the same retry pushback.

Every UNAVAILABLE the activator answers on its own (full buffer, activation failed or too
slow, shutting down, state store down) carries when to try again as trailing metadata, in
two forms: ``grpc-retry-pushback-ms`` (milliseconds), which gRPC clients with a retry policy
obey by themselves (gRPC's retry design, A6), and ``retry-after`` (seconds), the HTTP
API's ``Retry-After`` under the same name, for clients that read metadata themselves.
"""

from __future__ import annotations

import logging
from typing import Final

import grpc

from activator.errors import (
    ActivatorUnavailableError,
    ClientClosedError,
    ForbiddenModelError,
    ModelNotRegisteredError,
    QuotaExceededError,
    RequestTooLargeError,
    SequenceLostError,
    TooManyRequestsError,
    UnauthenticatedError,
    UnroutableRequestError,
    UpstreamError,
    UpstreamTimeoutError,
)
from foundation.errors import ModelFailedError, ZeroserveError

__all__ = [
    "INTERNAL_MESSAGE",
    "Metadata",
    "UNPARSABLE_MESSAGE",
    "GrpcStatus",
    "grpc_status",
    "retry_metadata",
    "unknown_model_message",
]

logger = logging.getLogger(__name__)

Metadata = tuple[tuple[str, str | bytes], ...]
"""gRPC metadata as (key, value) pairs; values of ``-bin`` keys are bytes."""

_CODES: Final[dict[type[BaseException], grpc.StatusCode]] = {
    ClientClosedError: grpc.StatusCode.CANCELLED,
    RequestTooLargeError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    UnroutableRequestError: grpc.StatusCode.INVALID_ARGUMENT,
    UnauthenticatedError: grpc.StatusCode.UNAUTHENTICATED,
    ForbiddenModelError: grpc.StatusCode.PERMISSION_DENIED,
    # A key over its quota: retrying at once does not help, unlike a full buffer.
    QuotaExceededError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ModelNotRegisteredError: grpc.StatusCode.NOT_FOUND,
    # HTTP's 410: the system is not in the state the request needs (the sequence's state is
    # gone with its worker), and retrying the same request cannot help.
    SequenceLostError: grpc.StatusCode.FAILED_PRECONDITION,
    # The model's load fails for good: no retry helps until its registration changes.
    ModelFailedError: grpc.StatusCode.FAILED_PRECONDITION,
    TooManyRequestsError: grpc.StatusCode.UNAVAILABLE,
    ActivatorUnavailableError: grpc.StatusCode.UNAVAILABLE,
    UpstreamError: grpc.StatusCode.UNAVAILABLE,
    UpstreamTimeoutError: grpc.StatusCode.DEADLINE_EXCEEDED,
}
"""Error class → code; a subclass takes the code of its nearest mapped ancestor, and a
class mapped nowhere in its MRO is INTERNAL."""

INTERNAL_MESSAGE: Final = "internal server error"
"""What a client reads for an error that is not the activator's own (a bug): the traceback
goes to the log only."""

UNPARSABLE_MESSAGE: Final = "Unable to parse request"
"""Triton's answer (INTERNAL) to bytes that are not the RPC's request message."""


def unknown_model_message(model: str) -> str:
    """Triton's text for a model it does not know."""
    return f"Request for unknown model: '{model}' is not found"


class GrpcStatus:
    """A status to end a call with: code, message and trailing metadata."""

    __slots__ = ("code", "message", "metadata")

    def __init__(self, code: grpc.StatusCode, message: str, metadata: Metadata = ()) -> None:
        self.code = code
        self.message = message
        self.metadata = metadata


def grpc_status(error: BaseException, rpc: str) -> GrpcStatus:
    """The status a client gets for ``error`` raised serving ``rpc``; an error that is not
    a ZeroserveError is logged with its traceback and answered generically."""
    if not isinstance(error, ZeroserveError):
        logger.error("unexpected error serving %s", rpc, exc_info=error)
        return GrpcStatus(grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE)
    code = grpc.StatusCode.INTERNAL
    for cls in type(error).__mro__:
        mapped = _CODES.get(cls)
        if mapped is not None:
            code = mapped
            break
    if isinstance(error, ModelNotRegisteredError):
        return GrpcStatus(code, unknown_model_message(error.model))
    metadata: Metadata = ()
    if isinstance(error, TooManyRequestsError | ActivatorUnavailableError):
        metadata = retry_metadata(error.retry_after_s)
    return GrpcStatus(code, error.message, metadata)


def retry_metadata(retry_after_s: int) -> Metadata:
    """When to try again, in the two forms the module's docstring gives."""
    return (
        ("grpc-retry-pushback-ms", str(retry_after_s * 1000)),
        ("retry-after", str(retry_after_s)),
    )
