"""The node cache: models from object storage or local paths, as local Triton folders.

A fetch lists the source (one LIST, or a HEAD for a single file), and from the objects'
keys, sizes and ETags derives the version it wants. If that version is in the cache the
fetch is a hit and downloads nothing. Otherwise it takes the entry's node-wide lock, so
that one process fetches while the others wait and then hit; makes room by evicting the
least recently used folders that nobody pins; reuses (hard-links) objects unchanged since
an older version; downloads the rest with parallel ranged GETs; verifies, fsyncs and renames
the folder into place. The result comes back pinned: it is never evicted until unpinned.

Local sources (``file://`` and plain paths) are not copied: a folder is used where it is,
and a single file is laid out as ``1/model.<ext>`` through a symlink in the cache. A Hugging
Face model folder (:mod:`data_plane.storage.layout`) becomes version ``1`` of a Triton
folder: its objects are fetched under ``1/``, a local one is linked as ``1``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Self

from prometheus_client import CollectorRegistry

from data_plane.storage.errors import (
    CacheFullError,
    StorageNotAllowedError,
    StorageNotFoundError,
    StorageTimeoutError,
)
from data_plane.storage.layout import (
    HF_VERSION,
    ModelLayout,
    as_version_one,
    check_model_layout,
)
from data_plane.storage.metrics import CacheMetrics
from data_plane.storage.s3 import Listing, S3Store, create_s3_client
from data_plane.storage.settings import CacheSettings
from data_plane.storage.uris import StorageUri, check_model_name
from runtimes.cache.layout import (
    MODEL_FOLDER,
    CacheLayout,
    fsync_dir,
    fsync_tree,
    local_entries,
    local_files,
    read_manifest,
    write_manifest,
)
from runtimes.cache.pins import (
    PIN_FILENAME,
    LockTimeoutError,
    Pin,
    exclusive_lock,
    try_exclusive,
)

logger = logging.getLogger(__name__)


class CachedModel:
    """A model folder ready to load, pinned in the node cache until :meth:`unpin`.

    ``path`` is a Triton-layout folder (``config.pbtxt`` if the source had one, and numeric
    version folders); ``layout`` says whether the source was one, or a Hugging Face folder
    laid out as version 1. ``digest`` identifies the content: it changes when any object (S3:
    ETag; local: size or mtime) changes. Hold the pin while the model is loaded and unpin
    after unloading it, or when its load fails; :meth:`unpin` is idempotent.
    """

    def __init__(
        self,
        *,
        path: Path,
        digest: str,
        uri: StorageUri,
        size_bytes: int,
        fetched_bytes: int,
        pin: Pin | None,
        layout: ModelLayout = ModelLayout.TRITON,
    ) -> None:
        self.path = path
        self.layout = layout
        self.digest = digest
        self.uri = uri
        self.size_bytes = size_bytes
        """Bytes of the model's files."""
        self.fetched_bytes = fetched_bytes
        """Bytes this fetch downloaded: 0 for a cache hit or a local source."""
        self._pin = pin

    @property
    def is_pinned(self) -> bool:
        return self._pin is not None and self._pin.is_held

    def unpin(self) -> None:
        """Let the cache evict this model again (marks it as just used)."""
        if self._pin is not None:
            self._pin.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unpin()

    def __repr__(self) -> str:
        return f"CachedModel({str(self.uri)!r}, path={str(self.path)!r}, digest={self.digest[:12]})"


@dataclass(frozen=True, slots=True)
class FetchProgress:
    """A download under way: the bytes written so far of those it needs."""

    fetched_bytes: int
    total_bytes: int


class NodeCache:
    """Fetches models into the node-local cache, shared by every worker process on the node.

    Parameters:
        settings: the cache folder, its bound, and the transfer knobs.
        registry: where the cache's metrics are registered.
        s3_client_factory: builds the boto3 S3 client (once, lazily); the default uses the
            standard AWS credential chain and ``AWS_ENDPOINT_URL(_S3)``. Tests pass one
            that points at a loopback server (see :func:`create_s3_client`).

    Every method is safe to call concurrently; blocking work runs in worker threads (the
    fetch in ``asyncio.to_thread``, ranged GETs on the cache's ``s3-fetch`` executor).
    Call :meth:`close` on shutdown.
    """

    def __init__(
        self,
        settings: CacheSettings,
        *,
        registry: CollectorRegistry,
        s3_client_factory: Callable[[], Any] | None = None,
    ) -> None:
        self._settings = settings
        self._layout = CacheLayout(settings.root)
        self._metrics = CacheMetrics(registry)
        self._metrics.max_bytes.set(settings.max_bytes)
        self._client_factory = s3_client_factory or partial(create_s3_client, settings)
        self._store: S3Store | None = None
        self._store_lock = threading.Lock()
        self._executor = ThreadPoolExecutor(
            max_workers=settings.concurrency, thread_name_prefix="s3-fetch"
        )
        self._fetching: dict[str, FetchProgress] = {}
        """model -> its download under way. Written by fetch threads, read on the loop:
        each write replaces one item, which the GIL keeps whole."""

    @property
    def settings(self) -> CacheSettings:
        return self._settings

    async def fetch(self, uri: StorageUri, *, model: str) -> CachedModel:
        """The model at ``uri`` as a local folder, pinned; downloads only what is missing.

        Raises a :class:`~data_plane.storage.errors.StorageError` subclass that says why
        when the model cannot be had. If the caller is cancelled, the fetch finishes in its
        thread (so the next load finds it cached) and its pin is dropped.
        """
        check_model_name(model, uri=str(uri))
        return await asyncio.to_thread(self._fetch, uri, model)

    def fetch_progress(self, model: str) -> FetchProgress | None:
        """How far the download of ``model``'s files has come; None when none is under way
        (the files were cached, local, or are not being fetched)."""
        return self._fetching.get(model)

    async def list_models(self, uri: StorageUri) -> list[str]:
        """The model folder names directly under ``uri`` (a model repository)."""
        if uri.is_s3:
            return await asyncio.to_thread(lambda: self._s3().list_models(uri))
        return await asyncio.to_thread(_local_model_names, uri)

    async def size_bytes(self) -> int:
        """The cache's current size (also updates the size gauge)."""
        return await asyncio.to_thread(self._measure)

    async def close(self) -> None:
        """Stop the transfer threads and close the S3 client's connections."""
        await asyncio.to_thread(self._executor.shutdown, wait=True, cancel_futures=True)
        store, self._store = self._store, None
        if store is not None:
            with contextlib.suppress(Exception):
                store.close()

    # ---- blocking internals (worker threads) ----

    def _fetch(self, uri: StorageUri, model: str) -> CachedModel:
        if not uri.is_s3:
            return self._open_local(uri)
        started = time.monotonic()
        store = self._s3()
        listing = store.list_model(uri)
        layout = check_model_layout((o.relative for o in listing.objects), uri=str(uri))
        if layout is ModelLayout.HUGGING_FACE:
            listing = as_version_one(listing)
        entry = self._layout.entry_name(store.endpoint, str(uri))
        digest = _listing_digest(store.endpoint, uri, listing)
        version = self._layout.models / entry / digest[:32]
        cached = self._open_version(uri, version, digest, layout)
        if cached is None:
            self._layout.ensure()
            try:
                with exclusive_lock(
                    self._layout.lock_path(entry), timeout_s=self._settings.lock_timeout_s
                ):
                    # Another process may have fetched it while we waited for the lock.
                    cached = self._open_version(uri, version, digest, layout)
                    if cached is None:
                        cached = self._download(
                            store, uri, listing, version, digest, layout, model=model
                        )
            except LockTimeoutError as exc:
                raise StorageTimeoutError(
                    uri=str(uri),
                    reason=f"another process has been fetching it for more than "
                    f"{self._settings.lock_timeout_s:g} s",
                ) from exc
        if cached.fetched_bytes:
            self._metrics.misses.inc()
            self._metrics.fetched_bytes.inc(cached.fetched_bytes)
            self._metrics.fetch_duration.observe(time.monotonic() - started)
            logger.info(
                "fetched model %s from %s: %d bytes in %.3f s",
                model,
                uri,
                cached.fetched_bytes,
                time.monotonic() - started,
                extra={"model": model, "uri": str(uri)},
            )
        else:
            self._metrics.hits.inc()
            logger.info("model %s from %s: node cache hit", model, uri, extra={"model": model})
        return cached

    def _open_version(
        self, uri: StorageUri, version: Path, digest: str, layout: ModelLayout
    ) -> CachedModel | None:
        try:
            pin = Pin.acquire(version, timeout_s=self._settings.lock_timeout_s)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except LockTimeoutError as exc:
            raise StorageTimeoutError(uri=str(uri), reason="the cache entry stays locked") from exc
        manifest = read_manifest(version)
        if manifest is None or not pin.is_current():
            pin.release()  # evicted between our look and our pin
            return None
        pin.touch()
        return CachedModel(
            path=version / MODEL_FOLDER,
            digest=digest,
            uri=uri,
            size_bytes=int(manifest["size_bytes"]),
            fetched_bytes=0,
            pin=pin,
            layout=layout,
        )

    def _download(
        self,
        store: S3Store,
        uri: StorageUri,
        listing: Listing,
        version: Path,
        digest: str,
        model_layout: ModelLayout,
        *,
        model: str,
    ) -> CachedModel:
        layout = self._layout
        layout.sweep_tmp()
        reusable = _reusable_files(version.parent, listing)
        needed = sum(o.size for o in listing.objects if o.relative not in reusable)
        self._fetching[model] = FetchProgress(0, needed)

        def on_bytes(count: int) -> None:
            done = self._fetching.get(model)
            if done is not None:
                self._fetching[model] = FetchProgress(done.fetched_bytes + count, needed)

        tmp = layout.new_tmp_dir(version.name, needed)
        pin = Pin.acquire(tmp, timeout_s=self._settings.lock_timeout_s, create=True)
        try:
            self._make_room(uri, needed)
            model_dir = tmp / MODEL_FOLDER
            records: list[dict[str, Any]] = []
            fetched = 0
            for obj in listing.objects:
                dest = model_dir / obj.relative
                dest.parent.mkdir(parents=True, exist_ok=True)
                check = None
                if not _link(reusable.get(obj.relative), dest, obj.size):
                    check = store.download(uri, obj, dest, on_bytes=on_bytes)
                    fetched += obj.size
                records.append(
                    {"key": obj.key, "path": obj.relative, "size": obj.size, "etag": obj.etag}
                    | ({"checked": check} if check else {})
                )
            write_manifest(
                tmp,
                {
                    "format": 1,
                    "source": str(uri),
                    "endpoint": store.endpoint,
                    "digest": digest,
                    "single_file": listing.is_single_file,
                    "objects": records,
                    "size_bytes": sum(o.size for o in listing.objects),
                },
            )
            fsync_tree(tmp)
            version.parent.mkdir(parents=True, exist_ok=True)
            os.rename(tmp, version)
            fsync_dir(version.parent)
        except BaseException:
            pin.release()
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            self._fetching.pop(model, None)
        pin.path = version / PIN_FILENAME
        self._measure()
        return CachedModel(
            path=version / MODEL_FOLDER,
            digest=digest,
            uri=uri,
            size_bytes=sum(o.size for o in listing.objects),
            fetched_bytes=fetched,
            pin=pin,
            layout=model_layout,
        )

    def _make_room(self, uri: StorageUri, needed: int) -> None:
        """Evict LRU unpinned folders until the cache (counting this fetch) fits its bound."""
        layout, limit = self._layout, self._settings.max_bytes
        if needed > limit:
            raise CacheFullError(
                uri=str(uri),
                reason=f"the model needs {needed} bytes, more than the node cache's bound of "
                f"{limit} bytes (ZEROSERVE_CACHE_MAX_BYTES)",
            )
        try:
            with exclusive_lock(layout.evict_lock, timeout_s=self._settings.lock_timeout_s):
                skipped: set[Path] = set()
                while (size := layout.size_bytes()) > limit:
                    candidates = sorted(
                        (
                            item
                            for item in layout.items()
                            if not item.is_in_progress and item.path not in skipped
                        ),
                        key=lambda item: item.last_used,
                    )
                    if not candidates:
                        raise CacheFullError(
                            uri=str(uri),
                            reason=f"the node cache cannot make room for {needed} bytes: "
                            f"{size} of its {limit} bytes are pinned by loaded or loading "
                            "models (raise ZEROSERVE_CACHE_MAX_BYTES or unload models)",
                        )
                    victim = candidates[0]
                    if self._evict(victim.path):
                        self._metrics.evictions.inc()
                    else:
                        skipped.add(victim.path)
        except LockTimeoutError as exc:
            raise StorageTimeoutError(uri=str(uri), reason="eviction lock wait timed out") from exc
        finally:
            self._metrics.size_bytes.set(layout.size_bytes())

    def _evict(self, folder: Path) -> bool:
        fd = try_exclusive(folder / PIN_FILENAME)
        if fd is None:
            return False  # pinned: loaded, being fetched, or being read right now
        try:
            self._layout.remove(folder)
        except FileNotFoundError:
            return False
        finally:
            os.close(fd)
        logger.info("evicted %s from the node cache", folder, extra={"path": str(folder)})
        return True

    def _open_local(self, uri: StorageUri) -> CachedModel:
        source = uri.local_path
        allowed = uri.allowed_root_path.resolve()
        try:
            real = source.resolve(strict=True)
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise StorageNotFoundError(uri=str(uri), reason="no such file or folder") from exc
        _check_inside(real, allowed, uri)
        if real.is_dir():
            entries = list(local_entries(real))
            for _relative, path in entries:
                _check_inside(path.resolve(), allowed, uri)
            files = list(local_files(real))
            # An ensemble's version folder is empty in Triton's layout: a version folder
            # counts as a model's even with nothing in it.
            folders = [f"{relative}/" for relative, path in entries if path.is_dir()]
            layout = check_model_layout([relative for relative, _ in files] + folders, uri=str(uri))
            digest = _local_digest(uri, [(rel, path.stat()) for rel, path in files])
            size = sum(path.stat().st_size for _, path in files)
            if layout is ModelLayout.HUGGING_FACE:
                # Presented as version 1 of a Triton folder, so what reads it sees one layout.
                path = self._link_as(real, HF_VERSION)
            else:
                path = real
            return CachedModel(
                path=path,
                digest=digest,
                uri=uri,
                size_bytes=size,
                fetched_bytes=0,
                pin=None,
                layout=layout,
            )
        stat = real.stat()
        digest = _local_digest(uri, [("1/model", stat)])
        return CachedModel(
            path=self._link_as(real, f"1/model{real.suffix}"),
            digest=digest,
            uri=uri,
            size_bytes=stat.st_size,
            fetched_bytes=0,
            pin=None,
        )

    def _link_as(self, real: Path, relative: str) -> Path:
        """``links/<entry>/model/<relative>`` pointing at ``real`` (a single model file as
        ``1/model.<ext>``, a Hugging Face folder as ``1``), made atomically; returns the
        ``model`` folder."""
        layout = self._layout
        layout.ensure()
        folder = layout.links / layout.entry_name(str(real))
        model_dir = folder / MODEL_FOLDER
        link = model_dir / relative
        if link.is_symlink() and Path(os.readlink(link)) == real:
            return model_dir
        tmp = layout.new_tmp_dir("link", 0)
        try:
            made = tmp / MODEL_FOLDER / relative
            made.parent.mkdir(parents=True)
            made.symlink_to(real)
            if folder.exists():
                layout.remove(folder)
            with contextlib.suppress(OSError):  # another process made the same link first
                os.rename(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return model_dir

    def _measure(self) -> int:
        size = self._layout.size_bytes()
        self._metrics.size_bytes.set(size)
        return size

    def _s3(self) -> S3Store:
        with self._store_lock:
            if self._store is None:
                self._store = S3Store(self._client_factory(), self._settings, self._executor)
            return self._store


def _check_inside(real: Path, allowed: Path, uri: StorageUri) -> None:
    if not real.is_relative_to(allowed):
        raise StorageNotAllowedError(
            uri=str(uri), reason=f"{real} (symlinks resolved) is outside the allowed root {allowed}"
        )


def _local_model_names(uri: StorageUri) -> list[str]:
    root = uri.local_path
    if not root.is_dir():
        raise StorageNotFoundError(uri=str(uri), reason="no such folder")
    names = []
    for path in sorted(root.iterdir()):
        if path.is_dir() and not path.name.startswith("."):
            with contextlib.suppress(StorageNotAllowedError):
                check_model_name(path.name, uri=str(uri))
                names.append(path.name)
    return names


def _listing_digest(endpoint: str, uri: StorageUri, listing: Listing) -> str:
    identity = {
        "endpoint": endpoint,
        "uri": str(uri),
        "objects": sorted((o.relative, o.size, o.etag) for o in listing.objects),
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def _local_digest(uri: StorageUri, files: list[tuple[str, os.stat_result]]) -> str:
    # Sizes and mtimes, as make and rsync's quick check do: hashing the bytes of a multi-GB
    # model on every load would cost seconds. A changed file changes its mtime.
    identity = {
        "uri": str(uri),
        "files": sorted((rel, st.st_size, st.st_mtime_ns) for rel, st in files),
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def _reusable_files(entry: Path, listing: Listing) -> dict[str, Path]:
    """Objects of ``listing`` that an older version of the entry already holds, unchanged."""
    wanted: dict[tuple[Any, ...], str] = {
        (o.relative, o.size, o.etag): o.relative for o in listing.objects
    }
    found: dict[str, Path] = {}
    if not entry.is_dir():
        return found
    for version in sorted(entry.iterdir()):
        manifest = read_manifest(version)
        if manifest is None:
            continue
        for record in manifest.get("objects", ()):
            key = (record.get("path"), record.get("size"), record.get("etag"))
            relative = wanted.get(key)
            if relative is not None and relative not in found:
                found[relative] = version / MODEL_FOLDER / relative
    return found


def _link(source: Path | None, dest: Path, size: int) -> bool:
    """Hard-link an unchanged object from an older version; False if it is gone."""
    if source is None:
        return False
    try:
        os.link(source, dest)
    except (FileNotFoundError, OSError):
        return False
    if dest.stat().st_size != size:
        dest.unlink()
        return False
    return True
