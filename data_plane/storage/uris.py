"""Storage URIs: what they may name, and which of them this node may read.

Three spellings are accepted: ``s3://bucket/prefix`` (any S3-compatible store),
``file:///abs/path`` and a plain path. A URI names either a Triton-layout model folder or a
single model file; which of the two is decided when the store is asked (see ``cache``).

Parsing is lexical and does no I/O: plain paths are made absolute and normalized, and the
result must lie under one of the allowed roots (``ZEROSERVE_ALLOWED_STORAGE``), compared
component by component, so ``s3://models`` does not admit ``s3://models-private``. Local
symlinks are checked against the same root when the files are read. Object keys must be
usable as relative file paths: no empty, ``.`` or ``..`` component, no control character.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal
from urllib.parse import urlsplit

from data_plane.storage.errors import StorageNotAllowedError
from foundation.names import model_name_problem

_BUCKET: Final = re.compile(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]")
"""S3 bucket names (the general-purpose rules; dots allowed for legacy buckets)."""
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f\\]")

Scheme = Literal["s3", "file"]


@dataclass(frozen=True)
class StorageUri:
    """A parsed, allowed storage location.

    For ``s3``, ``bucket`` and ``key`` (the prefix, without leading or trailing ``/``; empty
    for a whole bucket). For ``file``, ``key`` is the absolute normalized path and ``bucket``
    is empty. ``allowed_root`` is the allowed entry that admitted the URI, in the same form.
    """

    scheme: Scheme
    bucket: str
    key: str
    allowed_root: str

    def __str__(self) -> str:
        if self.scheme == "s3":
            return f"s3://{self.bucket}/{self.key}" if self.key else f"s3://{self.bucket}"
        return f"file://{self.key}"

    @property
    def is_s3(self) -> bool:
        return self.scheme == "s3"

    @property
    def local_path(self) -> Path:
        """The local path of a ``file`` URI."""
        if self.scheme != "file":
            raise ValueError(f"{self} is not a local path")
        return Path(self.key)

    @property
    def allowed_root_path(self) -> Path:
        """The local path of the allowed root that admitted a ``file`` URI."""
        return Path(self.allowed_root.removeprefix("file://"))

    def child(self, name: str) -> StorageUri:
        """The URI of model ``name`` inside this one (a model repository); checks the name."""
        check_model_name(name, uri=str(self))
        if self.scheme == "s3":
            key = f"{self.key}/{name}" if self.key else name
        else:
            key = posixpath.join(self.key, name)
        return StorageUri(self.scheme, self.bucket, key, self.allowed_root)


def parse_storage_uri(uri: str, *, allowed: Sequence[str]) -> StorageUri:
    """Parse ``uri`` and check it lies under one of the ``allowed`` roots.

    ``allowed`` holds URIs or paths in the same spellings (``s3://bucket``,
    ``s3://bucket/prefix``, ``/abs/dir``, ``file:///abs/dir``). Raises
    :class:`StorageNotAllowedError` saying why when the URI is malformed or not allowed.
    """
    parsed = _parse(uri, what="storage URI")
    for entry in allowed:
        root = _parse(entry, what="allowed storage entry")
        if _is_under(parsed, root):
            return StorageUri(parsed.scheme, parsed.bucket, parsed.key, str(root))
    # Named for both ways in: the flag of `zeroserve up` and the setting behind it.
    how = "start zeroserve up with --allow-storage ROOT, or set ZEROSERVE_ALLOWED_STORAGE"
    if not allowed:
        reason = f"no storage is allowed on this node ({how})"
    else:
        reason = f"not under an allowed storage root ({', '.join(allowed)}); to allow it, {how}"
    raise StorageNotAllowedError(uri=uri, reason=reason)


def check_model_name(name: str, *, uri: str) -> None:
    """Refuse model names that break the one naming rule (``foundation.names``)."""
    problem = model_name_problem(name)
    if problem is not None:
        raise StorageNotAllowedError(uri=uri, reason=problem)


def relative_key(key: str, prefix: str, *, uri: str) -> str:
    """``key`` relative to ``prefix``, checked to be a safe relative file path.

    Raises :class:`StorageNotAllowedError` for keys that would escape the folder they are
    written to (``..``), name it (``.``, empty components) or carry control characters.
    """
    if prefix and not key.startswith(prefix + "/"):
        raise StorageNotAllowedError(uri=uri, reason=f"object key {key!r} is outside the prefix")
    relative = key[len(prefix) + 1 :] if prefix else key
    check_relative_path(relative, uri=uri)
    return relative


def check_relative_path(relative: str, *, uri: str) -> None:
    """Refuse relative paths that are empty, absolute, or have unsafe components."""
    parts = relative.split("/")
    if not relative or any(p in {"", ".", ".."} for p in parts) or _CONTROL.search(relative):
        raise StorageNotAllowedError(
            uri=uri, reason=f"object key {relative!r} would escape the cache folder; refused"
        )


def _parse(uri: str, *, what: str) -> StorageUri:
    if not uri or _CONTROL.search(uri.replace("\\", "/")):
        raise StorageNotAllowedError(uri=uri, reason=f"{what} is empty or has control characters")
    if uri.startswith("s3://"):
        return _parse_s3(uri, what=what)
    if uri.startswith("file:"):
        parts = urlsplit(uri)
        if parts.netloc not in {"", "localhost"} or not parts.path.startswith("/"):
            raise StorageNotAllowedError(
                uri=uri, reason=f"{what} must be file:///absolute/path on this host"
            )
        if parts.query or parts.fragment:
            raise StorageNotAllowedError(uri=uri, reason=f"{what} must not have ? or #")
        return StorageUri("file", "", posixpath.normpath(parts.path), "")
    if "://" in uri:
        scheme = uri.split("://", 1)[0]
        raise StorageNotAllowedError(
            uri=uri, reason=f"unsupported scheme {scheme!r}; use s3://, file:// or a path"
        )
    # Plain paths may be relative (a --model-repository given on the command line).
    return StorageUri("file", "", os.path.normpath(os.path.abspath(uri)), "")


def _parse_s3(uri: str, *, what: str) -> StorageUri:
    rest = uri[len("s3://") :]
    bucket, _, key = rest.partition("/")
    if not _BUCKET.fullmatch(bucket) or ".." in bucket:
        raise StorageNotAllowedError(uri=uri, reason=f"{what} has an invalid bucket name")
    key = key.rstrip("/")
    if key:
        check_relative_path(key, uri=uri)
    return StorageUri("s3", bucket, key, "")


def _is_under(uri: StorageUri, root: StorageUri) -> bool:
    if uri.scheme != root.scheme or uri.bucket != root.bucket:
        return False
    if not root.key or uri.key == root.key:
        return True
    base = root.key.rstrip("/")  # the file root "/" has key "/"
    return uri.key.startswith(base + "/")
