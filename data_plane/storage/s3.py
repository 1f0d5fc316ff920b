"""S3 (and S3-compatible) reads for the node cache: listing, and parallel ranged GETs.

Everything here blocks; the cache calls it from a worker thread, and the ranged GETs of one
object run on the cache's own executor (``s3-fetch-*`` threads). botocore clients are
thread-safe, so one client serves every thread; its connection pool is sized to the
concurrency. Each GET carries ``If-Match: <ETag>`` so that every part comes from the same
object version: an object replaced mid-fetch fails with a clear error instead of
producing a file stitched from two versions.

The coordinating thread consumes parts in order and feeds them to the checksum, so hashing
overlaps the transfer; at most ``2 x concurrency`` parts are in memory at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import queue
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from botocore import exceptions as bx
from botocore.config import Config

from data_plane.storage.checksums import ChecksumPlan, StreamHasher, plan_checksum
from data_plane.storage.errors import (
    StorageAccessDeniedError,
    StorageCorruptError,
    StorageError,
    StorageNotAllowedError,
    StorageNotFoundError,
    StorageTimeoutError,
    StorageUnavailableError,
)
from data_plane.storage.settings import CacheSettings
from data_plane.storage.uris import StorageUri, check_model_name, relative_key

logger = logging.getLogger(__name__)

_DENIED_CODES = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "AccountProblem",
    }
)
_RETRYABLE_BODY_ERRORS = (
    bx.ReadTimeoutError,
    bx.ResponseStreamingError,
    bx.IncompleteReadError,
    bx.ConnectionClosedError,
)


def create_s3_client(settings: CacheSettings, **client_kwargs: Any) -> Any:
    """A boto3 S3 client with the cache's timeouts, retries and pool size.

    Credentials come from the standard AWS chain and the endpoint from ``AWS_ENDPOINT_URL_S3``
    or ``AWS_ENDPOINT_URL`` (boto3 reads both) unless ``endpoint_url`` is passed.
    """
    import boto3  # deferred: importing boto3 costs ~0.1 s and most tests never need it

    config = Config(
        connect_timeout=settings.connect_timeout_s,
        read_timeout=settings.read_timeout_s,
        retries={"max_attempts": settings.max_attempts, "mode": "standard"},
        # The ranged GETs plus a listing or HEAD from a concurrent fetch.
        max_pool_connections=settings.concurrency + 2,
        tcp_keepalive=True,
        user_agent_extra="zeroserve",
    )
    return boto3.session.Session().client("s3", config=config, **client_kwargs)


@dataclass(frozen=True)
class RemoteObject:
    """One object of a model: its key, where it goes in the model folder, size and ETag."""

    key: str
    relative: str
    size: int
    etag: str


@dataclass(frozen=True)
class Listing:
    """What a URI names: a model folder's objects, or one model file laid out as version 1."""

    objects: tuple[RemoteObject, ...]
    is_single_file: bool


class S3Store:
    """Reads models from one S3 endpoint through one client."""

    def __init__(self, client: Any, settings: CacheSettings, executor: Executor) -> None:
        self._client = client
        self._settings = settings
        self._executor = executor

    def close(self) -> None:
        """Close the client's pooled connections."""
        self._client.close()

    @property
    def endpoint(self) -> str:
        """The endpoint URL: part of the cache key, since buckets are per endpoint."""
        return str(self._client.meta.endpoint_url)

    def list_model(self, uri: StorageUri) -> Listing:
        """The objects of the model at ``uri``: a folder's objects, else the single object."""
        prefix = uri.key
        try:
            objects = [
                RemoteObject(
                    key=item["Key"],
                    relative=relative_key(item["Key"], prefix, uri=str(uri)),
                    size=int(item["Size"]),
                    etag=str(item["ETag"]).strip('"'),
                )
                for item in self._list(uri, f"{prefix}/" if prefix else "")
                if not item["Key"].endswith("/")  # folder markers made by consoles
            ]
        except StorageAccessDeniedError:
            if not prefix:
                raise
            # A credential may read one object without being allowed to list: try it as a file.
            with contextlib.suppress(StorageNotFoundError, StorageAccessDeniedError):
                return self._single_file(uri)
            raise
        if objects:
            return Listing(tuple(objects), is_single_file=False)
        if not prefix:
            raise StorageNotFoundError(uri=str(uri), reason="the bucket is empty")
        return self._single_file(uri)

    def list_models(self, uri: StorageUri) -> list[str]:
        """The model folder names directly under ``uri`` (an S3 model repository)."""
        prefix = f"{uri.key}/" if uri.key else ""
        names: list[str] = []
        paginator = self._client.get_paginator("list_objects_v2")
        pages = paginator.paginate(Bucket=uri.bucket, Prefix=prefix, Delimiter="/")
        try:
            for page in pages:
                for common in page.get("CommonPrefixes", ()):
                    name = str(common["Prefix"])[len(prefix) :].rstrip("/")
                    try:
                        check_model_name(name, uri=str(uri))
                    except StorageNotAllowedError as exc:
                        logger.warning("skipping repository entry: %s", exc.message)
                        continue
                    names.append(name)
        except Exception as exc:
            raise translate_error(exc, uri=str(uri)) from exc
        return sorted(names)

    def download(
        self,
        uri: StorageUri,
        obj: RemoteObject,
        dest: Path,
        *,
        on_bytes: Callable[[int], None] | None = None,
    ) -> str | None:
        """Write ``obj`` to the new file ``dest``, verified and fsynced; ``on_bytes`` is
        told the size of each part as it has been written (for progress).

        Returns the check that was made (``crc32 (x-amz-checksum-crc32)``) or None when
        only the size could be checked. Raises :class:`StorageCorruptError` on a size or
        checksum mismatch; ``dest`` is left for the caller to remove.
        """
        where = _object_uri(uri, obj)
        head = self._call(
            where,
            self._client.head_object,
            Bucket=uri.bucket,
            Key=obj.key,
            IfMatch=f'"{obj.etag}"',
            ChecksumMode="ENABLED",
        )
        if int(head["ContentLength"]) != obj.size:
            raise StorageUnavailableError(
                uri=where, reason="the object changed while it was being fetched; retry the load"
            )
        plan = None
        if self._settings.verify_checksums:
            plan = plan_checksum(head, size=obj.size, part_size=lambda: self._part1_size(uri, obj))
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            os.ftruncate(fd, obj.size)
            self._transfer(uri, obj, fd, plan, on_bytes)
            os.fsync(fd)
        finally:
            os.close(fd)
        return plan.describe() if plan else None

    def _transfer(
        self,
        uri: StorageUri,
        obj: RemoteObject,
        fd: int,
        plan: ChecksumPlan | None,
        on_bytes: Callable[[int], None] | None = None,
    ) -> None:
        part = self._settings.part_size_bytes
        ranges = [(start, min(start + part, obj.size)) for start in range(0, obj.size, part)]
        hasher = StreamHasher(plan) if plan else None
        stop = threading.Event()
        window = 2 * self._settings.concurrency
        pending: deque[Future[tuple[bytearray, int] | None]] = deque()
        upcoming = iter(ranges)
        # Part buffers are recycled: a fresh 8 MiB bytearray costs zeroing and page faults,
        # about a tenth of the CPU a transfer takes.
        buffers: queue.SimpleQueue[bytearray] = queue.SimpleQueue()

        def submit_next() -> None:
            span = next(upcoming, None)
            if span is not None:
                keep = hasher is not None
                pending.append(
                    self._executor.submit(self._get_range, uri, obj, fd, span, buffers, keep, stop)
                )
                lengths.append(span[1] - span[0])

        lengths: deque[int] = deque()
        try:
            for _ in range(window):
                submit_next()
            while pending:
                kept = pending.popleft().result()
                length = lengths.popleft()
                if on_bytes is not None:
                    on_bytes(length)
                submit_next()
                if hasher is not None and kept is not None:
                    buffer, length = kept
                    hasher.update(memoryview(buffer)[:length])
                    buffers.put(buffer)
        except BaseException:
            # The parts still running write into fd: let them stop before it is closed.
            stop.set()
            for future in pending:
                future.cancel()
            wait(pending)
            raise
        if hasher is not None and not hasher.matches():
            assert plan is not None
            raise StorageCorruptError(
                uri=_object_uri(uri, obj),
                reason=(
                    f"checksum mismatch: {plan.describe()} is {plan.expected} but the bytes "
                    f"received give {hasher.actual()}; the object is corrupt or was damaged "
                    "in transit"
                ),
            )

    def _get_range(
        self,
        uri: StorageUri,
        obj: RemoteObject,
        fd: int,
        span: tuple[int, int],
        buffers: queue.SimpleQueue[bytearray],
        keep: bool,
        stop: threading.Event,
    ) -> tuple[bytearray, int] | None:
        """Fetch one range into a buffer and write it at its offset; with ``keep`` the
        buffer is returned (for the checksum) instead of going back to ``buffers``."""
        start, end = span
        try:
            buffer = buffers.get_nowait()
        except queue.Empty:
            buffer = bytearray(self._settings.part_size_bytes)
        where = _object_uri(uri, obj)
        attempts = self._settings.max_attempts
        for attempt in range(1, attempts + 1):
            if stop.is_set():
                return None
            try:
                response = self._client.get_object(
                    Bucket=uri.bucket,
                    Key=obj.key,
                    Range=f"bytes={start}-{end - 1}",
                    IfMatch=f'"{obj.etag}"',
                )
                data = _read_body(response, memoryview(buffer)[: end - start], where=where)
            except _RETRYABLE_BODY_ERRORS as exc:
                # botocore retries failed requests, not bodies cut short or stalled mid-way.
                if attempt == attempts:
                    raise translate_error(exc, uri=where) from exc
                logger.debug("retrying bytes %s-%s of %s: %s", start, end - 1, where, exc)
                continue
            except StorageError:
                raise
            except Exception as exc:
                raise translate_error(exc, uri=where) from exc
            view, offset = data, start
            while view:
                written = os.pwrite(fd, view, offset)
                view, offset = view[written:], offset + written
            if keep:
                return buffer, end - start
            buffers.put(buffer)
            return None
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _part1_size(self, uri: StorageUri, obj: RemoteObject) -> int | None:
        head = self._call(
            _object_uri(uri, obj),
            self._client.head_object,
            Bucket=uri.bucket,
            Key=obj.key,
            PartNumber=1,
        )
        return int(head["ContentLength"]) if head.get("PartsCount") else None

    def _single_file(self, uri: StorageUri) -> Listing:
        try:
            head = self._call(str(uri), self._client.head_object, Bucket=uri.bucket, Key=uri.key)
        except StorageNotFoundError as exc:
            raise StorageNotFoundError(
                uri=str(uri), reason=f"no object '{uri.key}' and no objects under '{uri.key}/'"
            ) from exc
        suffix = posixpath.splitext(posixpath.basename(uri.key))[1]
        relative = f"1/model{suffix}"
        size, etag = int(head["ContentLength"]), str(head["ETag"]).strip('"')
        return Listing((RemoteObject(uri.key, relative, size, etag),), is_single_file=True)

    def _list(self, uri: StorageUri, prefix: str) -> list[dict[str, Any]]:
        paginator = self._client.get_paginator("list_objects_v2")
        try:
            return [
                item
                for page in paginator.paginate(Bucket=uri.bucket, Prefix=prefix)
                for item in page.get("Contents", ())
            ]
        except Exception as exc:
            raise translate_error(exc, uri=str(uri)) from exc

    def _call(self, where: str, method: Callable[..., Any], **kwargs: Any) -> Any:
        try:
            return method(**kwargs)
        except Exception as exc:
            raise translate_error(exc, uri=where) from exc


def _object_uri(uri: StorageUri, obj: RemoteObject) -> str:
    return f"s3://{uri.bucket}/{obj.key}"


def _read_body(response: Any, view: memoryview, *, where: str) -> memoryview:
    """Read the whole body into ``view`` (exactly its size) and return ``view``."""
    length = len(view)
    if int(response["ContentLength"]) != length:
        raise StorageCorruptError(
            uri=where,
            reason=f"asked for {length} bytes, the store sent {response['ContentLength']}",
        )
    body = response["Body"]
    try:
        filled = 0
        while filled < length:
            count = body.readinto(view[filled:])
            if not count:
                break
            filled += count
    finally:
        body.close()
    if filled != length:
        raise bx.IncompleteReadError(actual_bytes=filled, expected_bytes=length)
    return view


def translate_error(exc: BaseException, *, uri: str) -> StorageError:
    """A :class:`StorageError` that says why, for any boto3/botocore failure."""
    if isinstance(exc, StorageError):
        return exc
    if isinstance(exc, bx.ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        message = str(error.get("Message") or code)
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code == "NoSuchBucket":
            return StorageNotFoundError(uri=uri, reason="the bucket does not exist")
        if code in {"NoSuchKey", "404", "NotFound"} or status == 404:
            return StorageNotFoundError(uri=uri, reason="no such object (404)")
        if code in _DENIED_CODES or status == 403:
            return StorageAccessDeniedError(
                uri=uri,
                reason=f"access denied ({code}: {message}); check this node's AWS credentials "
                "and the bucket policy",
            )
        if code == "PreconditionFailed" or status == 412:
            return StorageUnavailableError(
                uri=uri, reason="the object changed while it was being fetched; retry the load"
            )
        if (status or 0) >= 500 or code in {"SlowDown", "Throttling", "RequestTimeout"}:
            return StorageUnavailableError(uri=uri, reason=f"the store answered {code}: {message}")
        return StorageError(uri=uri, reason=f"the store answered {code or status}: {message}")
    if isinstance(exc, bx.ConnectTimeoutError | bx.ReadTimeoutError):
        return StorageTimeoutError(uri=uri, reason=f"the store did not answer in time ({exc})")
    if isinstance(exc, bx.ResponseStreamingError | bx.IncompleteReadError):
        return StorageCorruptError(uri=uri, reason=f"the object was truncated in transit ({exc})")
    if isinstance(exc, bx.NoCredentialsError | bx.PartialCredentialsError):
        return StorageAccessDeniedError(
            uri=uri, reason=f"no usable AWS credentials on this node ({exc})"
        )
    if isinstance(exc, bx.EndpointConnectionError | bx.ConnectionClosedError):
        return StorageUnavailableError(uri=uri, reason=f"cannot reach the store ({exc})")
    if isinstance(exc, bx.ParamValidationError):
        return StorageNotAllowedError(uri=uri, reason=str(exc))
    return StorageError(uri=uri, reason=f"{type(exc).__name__}: {exc}")
