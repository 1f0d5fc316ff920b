"""Why a model could not be fetched from storage, free of HTTP and of boto3.

    DataPlaneError (runtimes.errors)
    └── StorageError                    a fetch failed; the model stays unloaded
        ├── StorageNotAllowedError      malformed URI, outside the allowed roots, or a name or
        │                               key that would escape the cache folder
        ├── StorageNotFoundError        no such bucket, key or path, or a folder without a model
        ├── StorageAccessDeniedError    the credentials may not read it (HTTP 403), or none
        ├── StorageCorruptError         truncated object, or size or checksum mismatch
        ├── CacheFullError              the node cache cannot make room: loaded models pin it
        ├── StorageTimeoutError         the store (or another process's fetch) took too long
        │   (also an UnavailableError: a retry later may succeed)
        └── StorageUnavailableError     the store is unreachable or answered 5xx / throttled
            (also an UnavailableError)

Every message names the URI and says why, so that a load error read by a person (or the
control plane) needs no log to be understood. The repository wraps these in
:class:`~data_plane.errors.ModelLoadError`.
"""

from __future__ import annotations

from typing import ClassVar

from data_plane.errors import DataPlaneError, UnavailableError


class StorageError(DataPlaneError):
    """A model could not be fetched from storage into the node cache."""

    kind: ClassVar[str] = "error"
    """Short machine-readable reason (``not_found``, ``access_denied``, ...) for logs."""

    def __init__(self, *, uri: str, reason: str) -> None:
        super().__init__(f"cannot fetch '{uri}': {reason}")
        self.uri = uri
        self.reason = reason


class StorageNotAllowedError(StorageError):
    """The URI is malformed, outside ``ZEROSERVE_ALLOWED_STORAGE``, or escapes the cache."""

    kind = "not_allowed"


class StorageNotFoundError(StorageError):
    """The bucket, key or path does not exist, or the folder holds no model."""

    kind = "not_found"


class StorageAccessDeniedError(StorageError):
    """The store refused the credentials (403), or no credentials were found."""

    kind = "access_denied"


class StorageCorruptError(StorageError):
    """The bytes received are not the object: truncated, wrong size or wrong checksum."""

    kind = "corrupt"


class CacheFullError(StorageError):
    """The node cache cannot make room: what is left is pinned by loaded or loading models."""

    kind = "cache_full"


class StorageTimeoutError(StorageError, UnavailableError):
    """The store did not answer in time, or another process's fetch held the lock too long."""

    kind = "timeout"


class StorageUnavailableError(StorageError, UnavailableError):
    """The store cannot be reached, or answered with a server error or throttling."""

    kind = "unavailable"
