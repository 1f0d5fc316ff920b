"""The one place where data plane errors become gRPC status codes.

Codes follow Triton's gRPC front end, which maps its core's error kinds one to one
(INVALID_ARG → INVALID_ARGUMENT, NOT_FOUND → NOT_FOUND, UNAVAILABLE → UNAVAILABLE,
UNSUPPORTED → UNIMPLEMENTED, INTERNAL → INTERNAL). Where the HTTP front end folds kinds
together, this table keeps them apart: an unknown model is NOT_FOUND here, as Triton's
gRPC answers, though HTTP answers it 400.
"""

from __future__ import annotations

import logging
from typing import Final, NoReturn

import grpc

from data_plane.errors import (
    InternalError,
    InvalidArgumentError,
    ModelLoadError,
    NotFoundError,
    UnavailableError,
    UnknownModelError,
    UnsupportedError,
    ZeroserveError,
)
from data_plane.shared_memory import RegionExistsError
from foundation import request_ids

logger = logging.getLogger(__name__)

STATUS: Final[dict[type[BaseException], grpc.StatusCode]] = {
    InvalidArgumentError: grpc.StatusCode.INVALID_ARGUMENT,
    UnknownModelError: grpc.StatusCode.NOT_FOUND,
    NotFoundError: grpc.StatusCode.NOT_FOUND,
    ModelLoadError: grpc.StatusCode.INVALID_ARGUMENT,
    UnavailableError: grpc.StatusCode.UNAVAILABLE,
    UnsupportedError: grpc.StatusCode.UNIMPLEMENTED,
    InternalError: grpc.StatusCode.INTERNAL,
    RegionExistsError: grpc.StatusCode.ALREADY_EXISTS,
}
"""Error class → code; a subclass takes the code of its nearest mapped ancestor, and a
class mapped nowhere in its MRO is INTERNAL."""

INTERNAL_MESSAGE: Final = "internal server error"
"""What a client reads for an error that is not the data plane's own (a bug): the
traceback goes to the log only."""


def status_for(error: BaseException) -> grpc.StatusCode:
    """The code of ``error``: that of the nearest class in its MRO in :data:`STATUS`."""
    for cls in type(error).__mro__:
        code = STATUS.get(cls)
        if code is not None:
            return code
    return grpc.StatusCode.INTERNAL


def error_status(error: Exception, rpc: str) -> tuple[grpc.StatusCode, str]:
    """The code and message a client gets for ``error`` raised serving ``rpc``; an error
    that is not a ZeroserveError is logged with its traceback and answered generically."""
    if isinstance(error, ZeroserveError):
        return status_for(error), error.message
    logger.error("unexpected error serving %s", rpc, exc_info=error)
    return grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE


async def abort(
    context: grpc.aio.ServicerContext[object, object], error: Exception, rpc: str
) -> NoReturn:
    """End the call with ``error``'s status (see :func:`error_status`), naming the call's
    ``x-request-id`` in the trailing metadata when it came with one."""
    code, message = error_status(error, rpc)
    trailing = tuple(
        (key, value)
        for key, value in context.invocation_metadata() or ()
        if key == request_ids.METADATA_KEY
    )
    await context.abort(code, message, trailing[:1])
