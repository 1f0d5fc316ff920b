"""Model storage for the data plane: URIs, the node-local cache, and reads from S3.

``parse_storage_uri`` turns ``s3://``, ``file://`` and plain-path URIs into a
:class:`StorageUri` that lies under an allowed root. :class:`NodeCache` makes any such URI a
local Triton-layout folder (:class:`CachedModel`; a Hugging Face model folder becomes version 1
of one, its :class:`ModelLayout` saying so), downloading from S3 at most once per
node and model version, and keeping the cache under its size bound without ever evicting a
model in use. Failures are :class:`StorageError` subclasses whose messages say why.
"""

from __future__ import annotations

from data_plane.storage.cache import CachedModel, FetchProgress, NodeCache
from data_plane.storage.errors import (
    CacheFullError,
    StorageAccessDeniedError,
    StorageCorruptError,
    StorageError,
    StorageNotAllowedError,
    StorageNotFoundError,
    StorageTimeoutError,
    StorageUnavailableError,
)
from data_plane.storage.layout import ModelLayout
from data_plane.storage.s3 import create_s3_client
from data_plane.storage.settings import CacheSettings
from data_plane.storage.uris import StorageUri, parse_storage_uri
from runtimes.cache.pins import Pin

__all__ = [
    "CacheFullError",
    "CacheSettings",
    "CachedModel",
    "FetchProgress",
    "ModelLayout",
    "NodeCache",
    "Pin",
    "StorageAccessDeniedError",
    "StorageCorruptError",
    "StorageError",
    "StorageNotAllowedError",
    "StorageNotFoundError",
    "StorageTimeoutError",
    "StorageUnavailableError",
    "StorageUri",
    "create_s3_client",
    "parse_storage_uri",
]
