"""Shared-memory errors, with the kinds and texts Triton 2.51 gives for the same cases.

Triton answers some client mistakes as INTERNAL (HTTP 500, gRPC INTERNAL): a key it cannot
open, a register body that is not JSON or whose members have the wrong type, a wrong-typed
shared-memory parameter of an infer request, an output region too small for the result.
We keep its kinds, so that a client sees the same status from both servers; the texts say
what is wrong either way.

    InvalidArgumentError (400)
    ├── RegionExistsError          a name registered twice (Triton ALREADY_EXISTS; 400 on HTTP)
    ├── RegionBoundsError          offset and size do not fit the object or region
    └── RegionLimitError           the server holds as many regions as it may
    NotFoundError (404)
    └── RegionNotFoundError        no region of that name
    InternalError (500)
    ├── RegionOpenError            the key names no shared-memory object we may open
    ├── SharedMemoryRequestError   a malformed request member, as Triton answers it
    └── OutputRegionTooSmallError  an output does not fit the bytes the request gave it
"""

from __future__ import annotations

from data_plane.errors import InternalError, InvalidArgumentError, NotFoundError


class RegionExistsError(InvalidArgumentError):
    """A region of this name is already registered (Triton's ALREADY_EXISTS kind, which
    its HTTP front end answers with 400 and its gRPC front end with ALREADY_EXISTS)."""

    def __init__(self, *, region: str) -> None:
        super().__init__(f"shared memory region '{region}' already in manager")
        self.region = region


class RegionBoundsError(InvalidArgumentError):
    """An offset and byte size that do not fit: a registration past the end of its object,
    or a tensor's place past the end of its region."""


class RegionLimitError(InvalidArgumentError):
    """The registry holds ``limit`` regions already; one must be unregistered first."""

    def __init__(self, *, region: str, limit: int) -> None:
        super().__init__(
            f"failed to register shared memory region '{region}': the server already holds "
            f"{limit} regions, its maximum; unregister one first"
        )
        self.region = region
        self.limit = limit


class RegionNotFoundError(NotFoundError):
    """No region of this name is registered.

    ``kind`` is how the text names the region: ``"system"`` or ``"cuda"`` for the status
    and register APIs, empty for an infer request (Triton's texts differ so).
    """

    def __init__(self, *, region: str, kind: str = "") -> None:
        which = f"{kind} shared memory" if kind else "shared memory"
        super().__init__(f"Unable to find {which} region: '{region}'")
        self.region = region
        self.kind = kind


class RegionOpenError(InternalError):
    """The key names no shared-memory object the server may open: absent, not a plain
    name under ``/dev/shm``, a link, a directory, not a regular file."""

    def __init__(self, *, key: str) -> None:
        super().__init__(f"Unable to open shared memory region: '{key}'")
        self.key = key


class SharedMemoryRequestError(InternalError):
    """A register body or shared-memory parameter Triton cannot parse; its front ends
    answer these as INTERNAL, so we do too (the text says which member is wrong)."""


class OutputRegionTooSmallError(InternalError):
    """An output needs more bytes than the request's ``shared_memory_byte_size`` gives it;
    Triton finds this while allocating the output and answers INTERNAL."""

    def __init__(self, *, output: str, given_bytes: int, needed_bytes: int) -> None:
        super().__init__(
            f"shared memory size specified with the request for output '{output}' "
            f"({given_bytes} bytes) should be at least {needed_bytes} bytes to hold the results"
        )
        self.output = output
        self.given_bytes = given_bytes
        self.needed_bytes = needed_bytes
