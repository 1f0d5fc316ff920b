"""The admin API's registration check: a record in, the stored model read and judged.

:class:`RegistrationInspector` turns a :class:`~foundation.records.ModelRecord` into what a
worker's load would get (the config ``worker_client.load_body`` sends), opens its storage
location, and runs :func:`~control_plane.inspection.checks.check_registration` in its own
thread, bounded by a timeout.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from control_plane.errors import InvalidRegistrationError, RegistrationCheckUnavailableError
from control_plane.inspection.checks import Registration, check_registration, poll_error
from control_plane.inspection.files import ModelFiles
from control_plane.inspection.sources import LocalFiles, S3Files
from control_plane.worker_client import load_body
from data_plane.storage.errors import StorageNotAllowedError
from data_plane.storage.s3 import S3Store
from data_plane.storage.settings import CacheSettings
from data_plane.storage.uris import parse_storage_uri
from foundation import model_config
from foundation.proto.model_config_pb2 import ModelConfig
from foundation.records import ModelRecord

__all__ = ["PoolOf", "RegistrationInspector"]

logger = logging.getLogger(__name__)

PoolOf = Callable[[ModelRecord], tuple[str, Collection[str] | None]]
"""A model's pool and the backends that pool's workers run (None: unknown)."""


class RegistrationInspector:
    """Checks registrations against their stored models.

    Parameters:
        allowed_storage: the roots storage URIs must lie under.
        allow_model_code: whether workers are allowed models that are code.
        pool_of: a model's pool and the backends its workers run.
        timeout_s: bound on one check; past it the check answers 503.
        s3_client_factory: makes the S3 client (boto3's, configured as a worker's cache);
            called once, on the first ``s3://`` check.
    """

    def __init__(
        self,
        *,
        allowed_storage: Collection[str],
        allow_model_code: bool,
        pool_of: PoolOf,
        timeout_s: float,
        s3_client_factory: Callable[[], Any] | None = None,
    ) -> None:
        self._allowed = tuple(allowed_storage)
        self._allow_model_code = allow_model_code
        self._pool_of = pool_of
        self._timeout_s = timeout_s
        self._s3_client_factory = s3_client_factory
        self._executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="inspect")
        self._s3: tuple[S3Store, Any] | None = None
        self._s3_lock = threading.Lock()

    async def check(self, record: ModelRecord) -> None:
        """Refuse ``record`` when no worker could load it.

        Raises InvalidRegistrationError (422) or RegistrationCheckUnavailableError (503).
        """
        loop = asyncio.get_running_loop()
        work = loop.run_in_executor(self._executor, functools.partial(self._check, record))
        try:
            async with asyncio.timeout(self._timeout_s):
                await work
        except TimeoutError:
            raise RegistrationCheckUnavailableError(
                model=record.name,
                reason=f"reading its storage took longer than {self._timeout_s:g} s",
            ) from None

    def close(self) -> None:
        """Stop the check threads (without waiting) and close the S3 client."""
        self._executor.shutdown(wait=False, cancel_futures=True)
        if self._s3 is not None:
            self._s3[0].close()

    def _check(self, record: ModelRecord) -> None:
        pool, backends = self._pool_of(record)
        registration = Registration(
            name=record.name,
            config=_load_config(record),
            allow_model_code=self._allow_model_code,
            pool=pool,
            pool_backends=backends,
        )
        check_registration(registration, self._files(record))

    def _files(self, record: ModelRecord) -> ModelFiles:
        try:
            uri = parse_storage_uri(record.storage_uri, allowed=self._allowed)
        except StorageNotAllowedError as exc:
            raise InvalidRegistrationError(
                model=record.name, message=poll_error(record.name, exc.message)
            ) from None
        if not uri.is_s3:
            return LocalFiles(uri)
        store, client = self._s3_store(record.name)
        return S3Files(uri, store, client)

    def _s3_store(self, model: str) -> tuple[S3Store, Any]:
        with self._s3_lock:
            if self._s3 is None:
                # A check lists and reads a few small objects: no downloads, no cache
                # writes, two connections at most.
                settings = CacheSettings(root=Path(), max_bytes=1, concurrency=2)
                if self._s3_client_factory is not None:
                    client = self._s3_client_factory()
                else:
                    from data_plane.storage.s3 import create_s3_client

                    client = create_s3_client(settings)
                # The store's executor runs downloads, which a check never makes.
                self._s3 = (S3Store(client, settings, self._executor), client)
            return self._s3


def _load_config(record: ModelRecord) -> ModelConfig | None:
    """The config a worker's load of ``record`` gets (None: the stored config.pbtxt)."""
    raw = load_body(record)["parameters"].get("config")
    if raw is None:
        return None
    try:
        return model_config.parse_json(raw)
    except model_config.ConfigError as exc:
        raise InvalidRegistrationError(
            model=record.name, message=poll_error(record.name, str(exc))
        ) from None
