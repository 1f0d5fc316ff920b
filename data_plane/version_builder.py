"""What one load builds: the plan (the config read, completed and checked, the versions
picked) and each version (its runtimes, warmed up, behind a batcher).

A plan that cannot be made is Triton's "failed to poll from model repository"
(:class:`ModelPollError`): nothing was built. A version that fails to build raises what
its runtime or its warmup raised; the repository words it as Triton does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from data_plane import model_code
from data_plane.batcher import Batcher, BatchPolicy
from data_plane.errors import ModelLoadError, ModelPollError
from data_plane.instances import Instances, config_for, device_shares, has_engine_features
from data_plane.model_version import LoadedVersion, TensorSpec
from data_plane.reshape import TensorReshape
from data_plane.response_cache import ModelResponseCache, ResponseCache
from data_plane.sequence import SequenceBatcher, create_sequence_batcher
from data_plane.stats import ModelStats
from data_plane.storage import CachedModel, ModelLayout
from data_plane.warmup import read_samples, run_warmup
from foundation import model_config
from foundation.datatypes import protocol_from_config
from foundation.proto.model_config_pb2 import ModelConfig
from runtimes.base import ModelRuntime
from runtimes.capabilities import Capabilities
from runtimes.llm import hf_folder
from runtimes.registry import RuntimeFactory, runtime_class_for

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadPlan:
    """What a load will build, worked out off the event loop."""

    model_dir: Path
    config: ModelConfig
    versions: list[int]
    runtime_class: type[ModelRuntime]
    fingerprint: str
    """The files' digest and the complete config: the same means nothing changed."""
    labels: dict[str, tuple[str, ...]]


def plan_load(
    name: str,
    cached: CachedModel,
    *,
    config_override: str | None,
    is_named_by_load: bool,
    allow_model_code: bool,
    gpu_count: int,
) -> LoadPlan:
    """Read and complete the config and pick versions (blocking: run it in a thread).

    ``is_named_by_load``: the model comes by storage URI, so the load's name is its name
    whatever its stored config.pbtxt says (the platform registers a folder under a name of
    its own; in a repository the folder's name and the config's must agree, as in Triton).
    Raises ModelPollError.
    """
    model_dir = cached.path
    if not model_dir.is_dir():
        raise ModelPollError(model=name, reason="not a model folder")
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
                f"at least one version must be available under the version policy of model '{name}'"
            )
        newest = max(version_dirs, key=lambda p: int(p.name))
        if cached.layout is ModelLayout.HUGGING_FACE:
            hf_folder.complete_config(newest, config, gpu_count=gpu_count)
        runtime_class = runtime_class_for(config, newest)
        # Before anything reads the model's files as code (complete_config may).
        if not allow_model_code and model_code.runs_model_code(runtime_class):
            raise model_config.ConfigError(
                f"model '{name}' is code ({runtime_class.kind} backend) and this load does "
                "not allow model code"
            )
        if not config.backend and not config.platform:
            config.backend = runtime_class.kind
        runtime_class.complete_config(newest, config)
        # Triton names the file it loads; the runtime's own name when that is the file.
        if not config.default_model_filename and (newest / runtime_class.model_filename).exists():
            config.default_model_filename = runtime_class.model_filename
        model_config.normalize(
            config,
            name=name,
            gpu_count=gpu_count,
            default_cpu_instances=runtime_class.default_cpu_instances,
        )
        versions = model_config.versions_to_load(model_dir, config)
        labels = {
            t.name: _read_labels(model_dir, t.label_filename)
            for t in config.output
            if t.label_filename
        }
    except (model_config.ConfigError, ValueError, OSError) as exc:
        raise ModelPollError(model=name, reason=str(exc)) from exc
    fingerprint = hashlib.sha256(
        cached.digest.encode() + config.SerializeToString(deterministic=True)
    ).hexdigest()
    return LoadPlan(model_dir, config, versions, runtime_class, fingerprint, labels)


def _read_labels(model_dir: Path, label_filename: str) -> tuple[str, ...]:
    path = (model_dir / label_filename).resolve()
    if not path.is_relative_to(model_dir.resolve()) or not path.is_file():
        raise model_config.ConfigError(
            f"label file '{label_filename}' not found in the folder of model '{model_dir.name}'"
        )
    return tuple(path.read_text(encoding="utf-8").splitlines())


class VersionBuilder:
    """Builds serving versions: runtimes from ``runtimes``, loaded on the devices the
    instance groups name, warmed up, behind a started batcher."""

    def __init__(
        self,
        runtimes: RuntimeFactory,
        *,
        batcher_queue_bound: int,
        warmup_timeout_s: float,
        response_cache: ResponseCache | None = None,
    ) -> None:
        self._runtimes = runtimes
        self._queue_bound = batcher_queue_bound
        self._warmup_timeout_s = warmup_timeout_s
        self._response_cache = response_cache

    async def build(self, name: str, version: int, plan: LoadPlan) -> LoadedVersion:
        """Version ``version`` of ``plan``, ready to serve; on failure nothing is left
        loaded. Raises what the runtime or the warmup raised."""
        started = time.monotonic()
        config = ModelConfig()
        config.CopyFrom(plan.config)
        samples = await asyncio.to_thread(read_samples, config, plan.model_dir)
        instances = await self._load_instances(name, version, plan, config)
        reshape = TensorReshape.from_config(config)
        try:
            inputs = {
                t.name: TensorSpec(
                    t.name, protocol_from_config(t.data_type), tuple(t.dims), t.optional
                )
                for t in config.input
            }
            outputs = {
                t.name: TensorSpec(
                    t.name,
                    protocol_from_config(t.data_type),
                    tuple(t.dims),
                    labels=plan.labels.get(t.name),
                )
                for t in config.output
            }
            if samples:
                await run_warmup(
                    samples,
                    instances,
                    reshape,
                    model=name,
                    outputs=tuple(outputs),
                    timeout_s=self._warmup_timeout_s,
                )
            stats = ModelStats()
            model_cache = None
            if self._response_cache is not None and config.response_cache.enable:
                model_cache = ModelResponseCache(
                    self._response_cache, model=name, version=version, stats=stats
                )
            capabilities = instances.capabilities
            execute_requests = (
                capabilities.requests.execute_requests
                if capabilities.requests is not None
                else None
            )
            batcher: Batcher | SequenceBatcher
            if config.HasField("sequence_batching"):
                batcher = await create_sequence_batcher(
                    config,
                    plan.model_dir,
                    instances.infer,
                    instance_count=instances.count,
                    queue_bound=self._queue_bound,
                    on_execution=stats.record_execution,
                    execute_requests=execute_requests,
                )
            else:
                policy = BatchPolicy.from_config(config, queue_bound=self._queue_bound)
                batcher = Batcher(
                    instances.infer,
                    dataclasses.replace(policy, instance_count=instances.count),
                    on_execution=stats.record_execution,
                    execute_requests=execute_requests,
                )
                await batcher.start()
        except BaseException:
            await instances.unload()
            raise
        return LoadedVersion(
            name=name,
            version=version,
            config=config,
            instances=instances,
            capabilities=capabilities,
            batcher=batcher,
            stats=stats,
            inputs=inputs,
            outputs=outputs,
            load_duration_s=time.monotonic() - started,
            reshape=reshape,
            response_cache=model_cache,
        )

    async def _load_instances(
        self, name: str, version: int, plan: LoadPlan, config: ModelConfig
    ) -> Instances:
        shares = device_shares(config)
        is_only = len(shares) == 1
        loaded: list[tuple[ModelRuntime, Capabilities, int]] = []
        try:
            for share in shares:
                runtime = self._runtimes.create(plan.runtime_class.kind, name=name, version=version)
                await runtime.load(
                    plan.model_dir / str(version),
                    config_for(config, share, is_only=is_only),
                    share.device,
                )
                capabilities = runtime.resolve_capabilities()
                loaded.append((runtime, capabilities, share.count))
                if not is_only and has_engine_features(capabilities):
                    devices = ", ".join(s.device for s in shares)
                    raise ModelLoadError(
                        model=name,
                        reason=f"instance groups on several devices ({devices}) are not "
                        f"supported by the {runtime.kind} backend; name one device in the "
                        "model's instance groups",
                    )
        except BaseException:
            for runtime, _capabilities, _count in loaded:
                try:
                    await runtime.unload()
                except Exception:
                    logger.exception("unloading %s after a failed load failed", name)
            raise
        return Instances(loaded)
