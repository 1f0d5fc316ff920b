"""The model repository: which model versions exist, which are loaded, and their lifecycle.

Loads are de-duplicated (a load of a model that is loading joins it) and never block the
event loop. A reload builds the new versions while the old ones keep serving, then swaps
them. An unload takes the version out of service at once, lets the requests it already
accepted finish, and returns only after the engine has released its memory.

Runtimes that can sleep (LLM engines) have a third state: :meth:`ModelRepository.sleep`
takes the model out of service like an unload but keeps its engine, asleep (KV cache freed,
weights in host memory); :meth:`ModelRepository.wake` puts it back in service without a load.
A load of a sleeping model that has not changed wakes it; an unload frees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from data_plane.ensemble import EnsembleLoader, EnsemblePlan, plan_ensemble
from data_plane.errors import (
    ModelLoadError,
    ModelNotReadyError,
    ModelPollError,
    ModelStorageUnavailableError,
    NotFoundError,
    UnavailableError,
    UnknownModelError,
    UnsupportedError,
    ZeroserveError,
)
from data_plane.model_version import (
    UNLOADED,
    FetchReport,
    IndexEntry,
    LoadedVersion,
    TensorSpec,
    VersionState,
)
from data_plane.response_cache import ResponseCache
from data_plane.storage import (
    CachedModel,
    CacheFullError,
    FetchProgress,
    NodeCache,
    StorageError,
    StorageUri,
    parse_storage_uri,
)
from data_plane.version_builder import LoadPlan, VersionBuilder, plan_load
from foundation import model_config
from runtimes.capabilities import Sleeper
from runtimes.registry import RuntimeFactory

__all__ = [
    "FetchReport",
    "IndexEntry",
    "LoadedVersion",
    "ModelRepository",
    "RepositorySettings",
    "TensorSpec",
    "VersionState",
]

logger = logging.getLogger(__name__)

_NO_VERSIONS = "Request for unknown model: '{name}' has no available versions"


@dataclass(frozen=True)
class RepositorySettings:
    """What the repository needs from the server's settings."""

    root: StorageUri
    """The model repository: a local folder or an s3:// prefix."""
    allowed_storage: tuple[str, ...]
    """Roots a load's ``storage_uri`` may name (``ZEROSERVE_ALLOWED_STORAGE``)."""
    gpu_count: int
    batcher_queue_bound: int
    drain_timeout_s: float
    warmup_timeout_s: float = 600.0
    """Bound on a version's ``model_warmup`` runs, all of them together."""


@dataclass
class _Entry:
    """Everything the repository knows about one model name."""

    name: str
    serving: dict[int, LoadedVersion] = field(default_factory=dict)
    states: dict[int, tuple[VersionState, str]] = field(default_factory=dict)
    fingerprint: str | None = None
    task: asyncio.Task[FetchReport | None] | None = None
    """The load (which returns its fetch report), unload, sleep or wake running now."""
    task_is_load: bool = False
    cached: CachedModel | None = None
    """The node-cache pin on the files the serving versions were built from."""
    sleeping: dict[int, LoadedVersion] = field(default_factory=dict)
    """Versions asleep: built, out of service, woken by :meth:`ModelRepository.wake`."""


class ModelRepository:
    """Names -> versions -> loaded runtimes, for one server process.

    ``runtimes`` builds each version's runtime (the repository closes it at :meth:`close`).
    ``on_load`` and ``on_unload`` let the metrics layer add and drop a version's series;
    ``on_sleep(model, seconds, is_wake)`` reports each sleep and wake. ``response_cache``
    is the server's, which versions whose config enables it use.
    """

    def __init__(
        self,
        settings: RepositorySettings,
        cache: NodeCache,
        runtimes: RuntimeFactory,
        *,
        on_load: Callable[[LoadedVersion], None] | None = None,
        on_unload: Callable[[LoadedVersion], None] | None = None,
        on_sleep: Callable[[str, float, bool], None] | None = None,
        response_cache: ResponseCache | None = None,
    ) -> None:
        self._settings = settings
        self._cache = cache
        self._runtimes = runtimes
        self._builder = VersionBuilder(
            runtimes,
            batcher_queue_bound=settings.batcher_queue_bound,
            warmup_timeout_s=settings.warmup_timeout_s,
            response_cache=response_cache,
        )
        self._entries: dict[str, _Entry] = {}
        self._required: set[str] = set()
        """The start-up models readiness waits on (until each is unloaded on purpose)."""
        self._on_load = on_load
        self._on_unload = on_unload
        self._on_sleep = on_sleep
        self._dropping: set[asyncio.Task[None]] = set()
        """Versions whose engine failed, being taken out of service."""
        self._ensembles = EnsembleLoader(
            self.get, self.load, drain_timeout_s=settings.drain_timeout_s
        )

    @property
    def root(self) -> StorageUri:
        return self._settings.root

    # ---- lookups (hot path: no I/O) ----

    def get(self, name: str, version: int | None = None) -> LoadedVersion:
        """The serving version asked for; ``None`` means the highest READY version."""
        entry = self._entries.get(name)
        if entry is None:
            raise UnknownModelError(model=name)
        if version is None:
            if not entry.serving:
                if entry.sleeping:
                    raise ModelNotReadyError(f"model '{name}' is sleeping; wake it first")
                raise NotFoundError(_NO_VERSIONS.format(name=name))
            return entry.serving[max(entry.serving)]
        loaded = entry.serving.get(version)
        if loaded is not None:
            return loaded
        if version in entry.sleeping:
            raise ModelNotReadyError(f"model '{name}' version {version} is sleeping; wake it first")
        if version in entry.states:
            raise ModelNotReadyError(
                f"Request for unknown model: '{name}' version {version} is not at ready state"
            )
        raise NotFoundError(f"Request for unknown model: '{name}' version {version} is not found")

    def fetch_progress(self, name: str) -> FetchProgress | None:
        """How far the download of ``name``'s files for a load under way has come; None when
        no download of it runs."""
        return self._cache.fetch_progress(name)

    def serving_versions(self, name: str) -> list[LoadedVersion]:
        """Every serving version of ``name`` (may be empty); raises for unknown names."""
        entry = self._entries.get(name)
        if entry is None:
            raise UnknownModelError(model=name)
        return [entry.serving[v] for v in sorted(entry.serving)]

    def all_serving(self) -> Iterator[LoadedVersion]:
        for name in sorted(self._entries):
            entry = self._entries[name]
            for version in sorted(entry.serving):
                yield entry.serving[version]

    def require(self, names: Iterable[str]) -> None:
        """Make readiness wait on ``names``, the models the server was started with.

        Triton's strict readiness: the server is ready once every start-up model serves.
        """
        self._required.update(names)

    def is_ready(self) -> bool:
        """Whether the server can serve what it was started with: every start-up model has
        a version serving (or asleep), or was unloaded on purpose since.

        A failed or running load of any other model (an explicit load) does not count: the
        server still serves everything else, and a readiness probe that failed on it would
        take a healthy worker out of service.
        """
        for name in self._required:
            entry = self._entries.get(name)
            if entry is None or not (entry.serving or entry.sleeping):
                return False
        return True

    async def index(self, *, ready_only: bool) -> list[IndexEntry]:
        """Triton's repository index: one row per known version, a name-only row otherwise."""
        on_disk = set(await self.model_names_on_disk())
        rows: list[IndexEntry] = []
        for name in sorted(on_disk | set(self._entries)):
            entry = self._entries.get(name)
            if name not in on_disk and entry is not None and _is_gone(entry):
                # Unloaded and no longer in the repository (removed in poll mode): Triton
                # lists it no more.
                continue
            if entry is None or not entry.states:
                if not ready_only:
                    rows.append(IndexEntry(name))
                continue
            for version in sorted(entry.states):
                state, reason = entry.states[version]
                if ready_only and state is not VersionState.READY:
                    continue
                rows.append(IndexEntry(name, version, state, reason))
        return rows

    async def model_names_on_disk(self) -> list[str]:
        """The model folders in the repository (local or s3://)."""
        try:
            return await self._cache.list_models(self._settings.root)
        except StorageError as exc:
            logger.warning("cannot list the model repository: %s", exc.message)
            return []

    # ---- lifecycle ----

    async def load(
        self,
        name: str,
        *,
        config_override: str | None = None,
        storage_uri: str | None = None,
        allow_model_code: bool = True,
    ) -> FetchReport:
        """Load (or reload) ``name``; returns when every selected version is READY, with
        where its files came from.

        The model comes from ``storage_uri`` (which must lie under an allowed root) or, by
        default, from the repository; either way through the node cache. A load of a model
        that is already loading joins that load (and reports its fetch). Loading an unchanged
        model again is a no-op; a changed one is rebuilt while the old versions serve.
        ``allow_model_code`` False refuses a model that is code (``model_code``), whatever
        its config or its files say.
        """
        try:
            model_config.validate_model_name(name)
        except model_config.ConfigError as exc:
            raise ModelPollError(model=name, reason=str(exc)) from exc
        entry = self._entries.get(name)
        if entry is None:
            entry = self._entries[name] = _Entry(name=name)
        while entry.task is not None and not entry.task.done():
            running = entry.task
            if (
                entry.task_is_load
                and config_override is None
                and storage_uri is None
                and allow_model_code
            ):
                # Join the load in progress: its outcome is ours.
                joined = await asyncio.shield(running)
                assert joined is not None  # a load's task returns its report
                return joined
            # An unload, or a load with other config, is in progress: ours starts after it.
            with contextlib.suppress(Exception):
                await asyncio.shield(running)
        task = asyncio.create_task(
            self._load(entry, config_override, storage_uri, allow_model_code), name=f"load-{name}"
        )
        entry.task, entry.task_is_load = task, True
        report = await asyncio.shield(task)
        # Ensembles that went out of service with this model come back with it.
        await self._ensembles.after_load(name)
        return report

    async def unload(self, name: str) -> None:
        """Take every version of ``name`` out of service, drain it, and free its engine.

        Unloading a name the server does not know does nothing, as in Triton.
        """
        # Asked for, so readiness no longer waits on it (even when nothing of it is known).
        self._required.discard(name)
        # The ensembles using this model cannot serve without it: they go first.
        await self._ensembles.before_unload(name, self.unload)
        entry = self._entries.get(name)
        if entry is None:
            return
        while entry.task is not None and not entry.task.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(entry.task)
        task = asyncio.create_task(self._unload(entry), name=f"unload-{name}")
        entry.task, entry.task_is_load = task, False
        await asyncio.shield(task)

    async def sleep(self, name: str) -> None:
        """Take every version of ``name`` out of service and put its engine to sleep.

        Requests in flight finish first (bounded by the drain timeout). Raises
        UnknownModelError, NotFoundError when nothing is loaded, and UnsupportedError when
        the model's runtime cannot sleep. Sleeping a sleeping model does nothing.
        """
        entry = self._entry_with_versions(name)
        await self._serialized(entry, self._sleep(entry), f"sleep-{name}")

    async def wake(self, name: str) -> None:
        """Put a sleeping model back in service; waking a serving model does nothing."""
        entry = self._entry_with_versions(name)
        await self._serialized(entry, self._wake(entry), f"wake-{name}")

    def _entry_with_versions(self, name: str) -> _Entry:
        entry = self._entries.get(name)
        if entry is None:
            raise UnknownModelError(model=name)
        if not entry.serving and not entry.sleeping and not (entry.task and not entry.task.done()):
            raise NotFoundError(_NO_VERSIONS.format(name=name))
        return entry

    async def _serialized(
        self, entry: _Entry, work: Coroutine[Any, Any, None], task_name: str
    ) -> None:
        """Run ``work`` after whatever load, unload, sleep or wake of the model runs now."""
        try:
            while entry.task is not None and not entry.task.done():
                with contextlib.suppress(Exception):
                    await asyncio.shield(entry.task)
        except BaseException:
            work.close()
            raise
        task = asyncio.create_task(work, name=task_name)
        entry.task, entry.task_is_load = task, False
        await asyncio.shield(task)

    async def close(self) -> None:
        """Let loads in progress settle (bounded), then unload everything and close the
        runtime factory, which stops what it keeps (server shutdown)."""
        running: list[asyncio.Task[Any]] = [
            e.task for e in self._entries.values() if e.task and not e.task.done()
        ]
        running.extend(self._dropping)
        if running:
            await asyncio.wait(running, timeout=self._settings.drain_timeout_s)
        await asyncio.gather(
            *(
                self.unload(name)
                for name, e in list(self._entries.items())
                if e.serving or e.sleeping
            ),
            return_exceptions=True,
        )
        await asyncio.to_thread(self._runtimes.close)

    async def _load(
        self,
        entry: _Entry,
        config_override: str | None,
        storage_uri: str | None,
        allow_model_code: bool,
    ) -> FetchReport:
        name = entry.name
        started = time.monotonic()
        try:
            cached, fetched = await self._fetch(name, storage_uri)
            try:
                ensemble = await asyncio.to_thread(
                    functools.partial(
                        plan_ensemble,
                        name,
                        cached,
                        config_override=config_override,
                        is_named_by_load=storage_uri is not None,
                    )
                )
                plan: LoadPlan | EnsemblePlan
                if ensemble is None:
                    plan = await asyncio.to_thread(
                        functools.partial(
                            plan_load,
                            name,
                            cached,
                            config_override=config_override,
                            is_named_by_load=storage_uri is not None,
                            allow_model_code=allow_model_code,
                            gpu_count=self._settings.gpu_count,
                        )
                    )
                else:
                    # Its composing models load first; it is checked against them.
                    plan = await self._ensembles.prepare(ensemble)
            except BaseException:
                cached.unpin()
                raise
        except ModelLoadError as exc:
            logger.warning("load of %s failed: %s", name, exc.message)
            if not entry.serving and not entry.states:
                # Nothing was ever known of this name: forget it again.
                self._entries.pop(name, None)
            raise
        versions = plan.versions
        if plan.fingerprint == entry.fingerprint and set(entry.serving) == set(versions):
            cached.unpin()  # the loaded versions hold their own pin on the same files
            return fetched
        if plan.fingerprint == entry.fingerprint and set(entry.sleeping) == set(versions):
            cached.unpin()
            await self._wake(entry)  # the same model, asleep: waking it is the load
            return fetched
        for version in versions:
            if version not in entry.serving:
                entry.states[version] = (VersionState.LOADING, "")
        built: dict[int, LoadedVersion] = {}
        try:
            for version in versions:
                built[version] = await self._build_version(name, version, plan)
        except Exception as exc:
            for loaded in built.values():
                await self._retire(loaded)
            cached.unpin()
            failed = next(v for v in versions if v not in built)
            reason = _failure_reason(failed, exc)
            for version in versions:
                if version not in entry.serving:
                    entry.states[version] = (VersionState.UNAVAILABLE, reason)
            logger.warning("load of %s version %s failed: %s", name, failed, reason)
            # Triton's words, which clients match on.
            raise ModelLoadError(
                model=name, reason=f"version {failed} is at UNAVAILABLE state: {reason};\n"
            ) from exc
        old, old_cached = {**entry.sleeping, **entry.serving}, entry.cached
        entry.serving, entry.cached, entry.sleeping = built, cached, {}
        entry.fingerprint = plan.fingerprint
        for version in versions:
            entry.states[version] = (VersionState.READY, "")
        for loaded in built.values():
            if self._on_load is not None:
                self._on_load(loaded)
        retired = [loaded for version, loaded in old.items()]
        for loaded in retired:
            if loaded.version not in built:
                entry.states[loaded.version] = (VersionState.UNAVAILABLE, UNLOADED)
            await self._retire(loaded)
        if old_cached is not None:
            old_cached.unpin()
        logger.info("loaded %s versions %s in %.3f s", name, versions, time.monotonic() - started)
        return fetched

    async def _fetch(self, name: str, storage_uri: str | None) -> tuple[CachedModel, FetchReport]:
        """The model's files in the node cache, pinned (the caller unpins), and how they
        were had: measured here, for this load only, so that overlapping loads each get
        their own answer."""
        started = time.monotonic()
        try:
            if storage_uri is None:
                uri = self._settings.root.child(name)
            else:
                uri = parse_storage_uri(storage_uri, allowed=self._settings.allowed_storage)
            cached = await self._cache.fetch(uri, model=name)
        except (UnavailableError, CacheFullError) as exc:
            raise ModelStorageUnavailableError(model=name, reason=exc.message) from exc
        except StorageError as exc:
            raise ModelPollError(model=name, reason=exc.message) from exc
        if not uri.is_s3:
            cache = "local"
        elif cached.fetched_bytes:
            cache = "miss"
        else:
            cache = "hit"
        return cached, FetchReport(cache, cached.fetched_bytes, time.monotonic() - started)

    async def _build_version(
        self, name: str, version: int, plan: LoadPlan | EnsemblePlan
    ) -> LoadedVersion:
        if isinstance(plan, EnsemblePlan):
            return await self._ensembles.build(version, plan)
        loaded = await self._builder.build(name, version, plan)
        for capabilities in loaded.instances.member_capabilities():
            if capabilities.failure is not None:
                capabilities.failure.on_failure(functools.partial(self._version_failed, loaded))
        return loaded

    def _version_failed(self, loaded: LoadedVersion, reason: str) -> None:
        """A serving version's engine failed on its own (its process died): take it out
        of service, in the background, so that a later load builds it again."""
        entry = self._entries.get(loaded.name)
        if entry is None or entry.serving.get(loaded.version) is not loaded:
            return
        task = asyncio.create_task(
            self._serialized(entry, self._drop_failed(entry, loaded, reason), "drop-failed"),
            name=f"drop-failed-{loaded.name}",
        )
        self._dropping.add(task)
        task.add_done_callback(self._dropping.discard)

    async def _drop_failed(self, entry: _Entry, loaded: LoadedVersion, reason: str) -> None:
        if entry.serving.get(loaded.version) is not loaded:
            return  # unloaded or replaced meanwhile
        entry.serving = {v: lv for v, lv in entry.serving.items() if lv is not loaded}
        entry.states[loaded.version] = (VersionState.UNAVAILABLE, reason)
        entry.fingerprint = None
        cached = None
        if not entry.serving and not entry.sleeping:
            cached, entry.cached = entry.cached, None
        logger.error("model %s version %s failed: %s", loaded.name, loaded.version, reason)
        try:
            await self._retire(loaded)
        finally:
            if cached is not None:
                cached.unpin()

    async def _sleep(self, entry: _Entry) -> None:
        serving = entry.serving
        sleepers = [_sleeper(loaded) for loaded in serving.values()]
        if not serving:
            return
        started = time.monotonic()
        # Out of service first: new requests get "not ready" while the engines drain.
        entry.serving = {}
        entry.sleeping = {**entry.sleeping, **serving}
        try:
            for loaded, sleeper in zip(serving.values(), sleepers, strict=True):
                entry.states[loaded.version] = (VersionState.SLEEPING, "")
                await sleeper.sleep()
        except BaseException:
            # An engine that failed to sleep cannot be trusted to serve: unload the model.
            logger.exception("sleep of %s failed; unloading it", entry.name)
            await self._unload(entry)
            raise
        if self._on_sleep is not None:
            self._on_sleep(entry.name, time.monotonic() - started, False)
        logger.info("%s asleep in %.3f s", entry.name, time.monotonic() - started)

    async def _wake(self, entry: _Entry) -> None:
        sleeping = entry.sleeping
        if not sleeping:
            return
        started = time.monotonic()
        try:
            for loaded in sleeping.values():
                await _sleeper(loaded).wake()
        except BaseException:
            logger.exception("wake of %s failed; unloading it", entry.name)
            await self._unload(entry)
            raise
        entry.sleeping = {}
        entry.serving = {**entry.serving, **sleeping}
        for version in sleeping:
            entry.states[version] = (VersionState.READY, "")
        if self._on_sleep is not None:
            self._on_sleep(entry.name, time.monotonic() - started, True)
        logger.info("%s awake in %.3f s", entry.name, time.monotonic() - started)

    async def _unload(self, entry: _Entry) -> None:
        serving, cached = {**entry.sleeping, **entry.serving}, entry.cached
        entry.serving, entry.cached, entry.sleeping = {}, None, {}
        entry.fingerprint = None
        for version in serving:
            entry.states[version] = (VersionState.UNLOADING, "")
        for loaded in serving.values():
            await self._retire(loaded)
            entry.states[loaded.version] = (VersionState.UNAVAILABLE, UNLOADED)
        if cached is not None:
            cached.unpin()
        logger.info("unloaded %s", entry.name)

    async def _retire(self, loaded: LoadedVersion) -> None:
        """Drain a version no longer reachable by new requests, then free its engine."""
        if self._on_unload is not None:
            self._on_unload(loaded)
        try:
            await loaded.batcher.close(timeout_s=self._settings.drain_timeout_s)
        finally:
            if loaded.response_cache is not None:
                loaded.response_cache.clear()
            await loaded.instances.unload()


def _sleeper(loaded: LoadedVersion) -> Sleeper:
    sleeper = loaded.capabilities.sleep
    if sleeper is None:
        raise UnsupportedError(
            f"model '{loaded.name}' ({loaded.runtime.kind}) cannot sleep; unload it instead"
        )
    return sleeper


def _failure_reason(version: int, error: BaseException) -> str:
    """Why ``version`` failed, as the index shows it: the error's own words, without the
    "version N is at UNAVAILABLE state" wording a runtime may have given it already."""
    if isinstance(error, ModelLoadError):
        reason = error.reason
    elif isinstance(error, ZeroserveError):
        reason = error.message
    else:
        reason = str(error) or repr(error)
    return reason.removeprefix(f"version {version} is at UNAVAILABLE state: ").removesuffix(";\n")


def _is_gone(entry: _Entry) -> bool:
    """Whether nothing of ``entry`` serves, loads or failed: every version it had was
    unloaded."""
    return bool(entry.states) and all(
        state == (VersionState.UNAVAILABLE, UNLOADED) for state in entry.states.values()
    )
