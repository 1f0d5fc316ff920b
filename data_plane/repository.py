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
import enum
import functools
import hashlib
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data_plane import model_code
from data_plane.batcher import Batcher, BatchPolicy
from data_plane.errors import (
    ModelLoadError,
    ModelNotReadyError,
    NotFoundError,
    UnknownModelError,
    UnsupportedError,
)
from data_plane.stats import ModelStats
from data_plane.storage import (
    CachedModel,
    NodeCache,
    StorageError,
    StorageUri,
    parse_storage_uri,
)
from foundation import model_config
from foundation.datatypes import protocol_from_config
from foundation.proto.model_config_pb2 import ModelConfig, ModelInstanceGroup
from runtimes.base import ModelRuntime
from runtimes.capabilities import Capabilities, Sleeper
from runtimes.registry import RuntimeFactory, runtime_class_for

logger = logging.getLogger(__name__)

_NO_VERSIONS = "Request for unknown model: '{name}' has no available versions"


class VersionState(enum.StrEnum):
    """Triton's model version states, as the repository index reports them."""

    UNKNOWN = "UNKNOWN"
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    LOADING = "LOADING"
    UNLOADING = "UNLOADING"
    SLEEPING = "SLEEPING"
    """Not a Triton state: loaded, asleep, out of service until woken (LLM engines)."""


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One configured input or output, in protocol terms."""

    name: str
    datatype: str
    dims: tuple[int, ...]
    optional: bool = False
    labels: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One row of the repository index: a model version the server knows, or (``version``
    None) a model it has only seen in the repository."""

    name: str
    version: int | None = None
    state: VersionState | None = None
    reason: str = ""
    """Why the version is in its state (a failed load's error, ``unloaded``), or empty."""


@dataclass(frozen=True, slots=True)
class FetchReport:
    """Where a load found the model's files: the node cache's answer for this load alone."""

    cache: str
    """``hit`` (the node cache held them), ``miss`` (they were downloaded) or ``local`` (a
    local folder, read in place: no cache involved)."""
    bytes_fetched: int
    """Bytes downloaded for this load (0 unless a miss)."""
    fetch_s: float
    """Seconds spent getting the files (listing and checking them, downloading on a miss)."""

    def to_json(self) -> dict[str, Any]:
        return {"cache": self.cache, "bytes_fetched": self.bytes_fetched, "fetch_s": self.fetch_s}


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


@dataclass
class LoadedVersion:
    """One model version that is serving (or draining): engine, batcher and counters."""

    name: str
    version: int
    config: ModelConfig
    runtime: ModelRuntime
    capabilities: Capabilities
    """What the runtime offers beyond infer (text generation, sleep, ...), asked once at load."""
    batcher: Batcher
    stats: ModelStats
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    load_duration_s: float

    @property
    def max_batch_size(self) -> int:
        return self.config.max_batch_size


@dataclass(frozen=True)
class _LoadPlan:
    """What a load will build, worked out off the event loop."""

    model_dir: Path
    config: ModelConfig
    versions: list[int]
    runtime_class: type[ModelRuntime]
    fingerprint: str
    labels: dict[str, tuple[str, ...]]


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
    ``on_sleep(model, seconds, is_wake)`` reports each sleep and wake.
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
    ) -> None:
        self._settings = settings
        self._cache = cache
        self._runtimes = runtimes
        self._entries: dict[str, _Entry] = {}
        self._required: set[str] = set()
        """The start-up models readiness waits on (until each is unloaded on purpose)."""
        self._on_load = on_load
        self._on_unload = on_unload
        self._on_sleep = on_sleep
        self._dropping: set[asyncio.Task[None]] = set()
        """Versions whose engine failed, being taken out of service."""

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
        on_disk = await self.model_names_on_disk()
        rows: list[IndexEntry] = []
        for name in sorted(set(on_disk) | set(self._entries)):
            entry = self._entries.get(name)
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
            raise ModelLoadError(model=name, reason=str(exc)) from exc
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
        return await asyncio.shield(task)

    async def unload(self, name: str) -> None:
        """Take every version of ``name`` out of service, drain it, and free its engine."""
        # Asked for, so readiness no longer waits on it (even when nothing of it is known).
        self._required.discard(name)
        entry = self._entries.get(name)
        if entry is None:
            raise UnknownModelError(model=name)
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
                plan = await asyncio.to_thread(
                    self._plan_load,
                    name,
                    config_override,
                    cached,
                    storage_uri is not None,
                    allow_model_code,
                )
            except BaseException:
                cached.unpin()
                raise
        except ModelLoadError:
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
            reason = exc.message if isinstance(exc, ModelLoadError) else str(exc) or repr(exc)
            for version in versions:
                if version not in entry.serving:
                    entry.states[version] = (VersionState.UNAVAILABLE, reason)
            logger.warning("load of %s failed: %s", name, reason)
            if isinstance(exc, ModelLoadError):
                raise
            raise ModelLoadError(model=name, reason=reason) from exc
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
                entry.states[loaded.version] = (VersionState.UNAVAILABLE, "unloaded")
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
        except StorageError as exc:
            raise ModelLoadError(model=name, reason=exc.message) from exc
        if not uri.is_s3:
            cache = "local"
        elif cached.fetched_bytes:
            cache = "miss"
        else:
            cache = "hit"
        return cached, FetchReport(cache, cached.fetched_bytes, time.monotonic() - started)

    def _plan_load(
        self,
        name: str,
        config_override: str | None,
        cached: CachedModel,
        is_named_by_load: bool,
        allow_model_code: bool,
    ) -> _LoadPlan:
        """Read and complete the config and pick versions (blocking: runs in a thread).

        ``is_named_by_load``: the model comes by storage URI, so the load's name is its name
        whatever its stored config.pbtxt says (the platform registers a folder under a name
        of its own; in a repository the folder's name and the config's must agree, as in
        Triton).
        """
        model_dir = cached.path
        if not model_dir.is_dir():
            raise ModelLoadError(model=name, reason="failed to poll from model repository")
        try:
            if config_override is not None:
                config = model_config.parse_json(config_override)
            else:
                config = model_config.read_config_file(model_dir) or ModelConfig()
            if is_named_by_load and config_override is None:
                config.name = name
            config.name = config.name or name
            version_dirs = [
                p for p in model_dir.iterdir() if p.is_dir() and model_config.is_version(p.name)
            ]
            if not version_dirs:
                raise model_config.ConfigError(
                    "at least one version must be available under the version policy of "
                    f"model '{name}'"
                )
            newest = max(version_dirs, key=lambda p: int(p.name))
            runtime_class = runtime_class_for(config, newest)
            # Before anything reads the model's files as code (complete_config may).
            if not allow_model_code and model_code.runs_model_code(runtime_class):
                raise model_config.ConfigError(
                    f"model '{name}' is code ({runtime_class.kind} backend) and this load "
                    "does not allow model code"
                )
            if not config.backend and not config.platform:
                config.backend = runtime_class.kind
            runtime_class.complete_config(newest, config)
            model_config.normalize(
                config,
                name=name,
                gpu_count=self._settings.gpu_count,
                default_cpu_instances=runtime_class.default_cpu_instances,
            )
            versions = model_config.versions_to_load(model_dir, config)
            labels = {
                t.name: _read_labels(model_dir, t.label_filename)
                for t in config.output
                if t.label_filename
            }
        except (model_config.ConfigError, ValueError, OSError) as exc:
            raise ModelLoadError(model=name, reason=str(exc)) from exc
        fingerprint = hashlib.sha256(
            cached.digest.encode() + config.SerializeToString(deterministic=True)
        ).hexdigest()
        return _LoadPlan(model_dir, config, versions, runtime_class, fingerprint, labels)

    async def _build_version(
        self,
        name: str,
        version: int,
        plan: _LoadPlan,
    ) -> LoadedVersion:
        started = time.monotonic()
        config = plan.config
        version_config = ModelConfig()
        version_config.CopyFrom(config)
        runtime = self._runtimes.create(plan.runtime_class.kind, name=name, version=version)
        group = config.instance_group[0]
        device = f"cuda:{group.gpus[0]}" if group.kind == ModelInstanceGroup.KIND_GPU else "cpu"
        await runtime.load(plan.model_dir / str(version), version_config, device)
        stats = ModelStats()
        capabilities = runtime.resolve_capabilities()
        try:
            batcher = Batcher(
                runtime.infer,
                BatchPolicy.from_config(
                    version_config, queue_bound=self._settings.batcher_queue_bound
                ),
                on_execution=stats.record_execution,
                execute_requests=(
                    capabilities.requests.execute_requests
                    if capabilities.requests is not None
                    else None
                ),
            )
            await batcher.start()
        except BaseException:
            await runtime.unload()
            raise
        loaded = LoadedVersion(
            name=name,
            version=version,
            config=version_config,
            runtime=runtime,
            capabilities=capabilities,
            batcher=batcher,
            stats=stats,
            inputs={
                t.name: TensorSpec(
                    t.name, protocol_from_config(t.data_type), tuple(t.dims), t.optional
                )
                for t in version_config.input
            },
            outputs={
                t.name: TensorSpec(
                    t.name,
                    protocol_from_config(t.data_type),
                    tuple(t.dims),
                    labels=plan.labels.get(t.name),
                )
                for t in version_config.output
            },
            load_duration_s=time.monotonic() - started,
        )
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
            entry.states[loaded.version] = (VersionState.UNAVAILABLE, "unloaded")
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
            await loaded.runtime.unload()


def _sleeper(loaded: LoadedVersion) -> Sleeper:
    sleeper = loaded.capabilities.sleep
    if sleeper is None:
        raise UnsupportedError(
            f"model '{loaded.name}' ({loaded.runtime.kind}) cannot sleep; unload it instead"
        )
    return sleeper


def _read_labels(model_dir: Path, label_filename: str) -> tuple[str, ...]:
    path = (model_dir / label_filename).resolve()
    if not path.is_relative_to(model_dir.resolve()) or not path.is_file():
        raise model_config.ConfigError(
            f"label file '{label_filename}' not found in the folder of model '{model_dir.name}'"
        )
    return tuple(path.read_text(encoding="utf-8").splitlines())
