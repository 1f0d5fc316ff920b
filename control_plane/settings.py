"""The control plane's settings: one frozen object, loaded once in ``__main__`` (or ``up``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from foundation.http import ServerLimits

__all__ = ["AdminClientSettings", "ControlPlaneSettings", "PoolSettings"]


class PoolSettings(BaseModel):
    """One worker pool: which models it takes, what its workers run them on, its size.

    The default pool is described by `ControlPlaneSettings`' own fields (``pool``,
    ``worker_device``, ...); each of its ``extra_pools`` is one of these.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    """The pool's name (a Knative pool's key in ``ZEROSERVE_KNATIVE_POOLS``)."""
    backends: tuple[str, ...] = ()
    """The model backends it takes (``vllm``): a model registered with one of them (its
    ``backend``, else its config's) goes here; empty for the default pool only."""
    device: Literal["cpu", "cuda"] = "cpu"
    """What its workers run models on."""
    memory_bytes: int = Field(default=0, ge=0)
    """Memory budget for models on one worker; 0 = unbounded."""
    host_memory_bytes: int = Field(default=0, ge=0)
    """Host memory on one worker for sleeping replicas' weights; 0 = unbounded."""
    max_models_per_worker: int = Field(default=0, ge=0)
    """Models one worker may hold at once; 0 = unbounded."""
    max_workers: int = Field(default=4, ge=1, le=1024)
    """Most workers the pool may have at once."""
    warm_workers: int = Field(default=0, ge=0)
    """Empty workers kept running for fast cold starts."""

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.warm_workers > self.max_workers:
            raise ValueError(f"pool '{self.name}': warm_workers must not exceed max_workers")
        return self


class ControlPlaneSettings(BaseSettings, ServerLimits):
    """How the control plane runs. Environment: ``ZEROSERVE_CONTROL_PLANE_*``.

    The admin API's connection limits are `ServerLimits`'.

    The admin token also reads ``ZEROSERVE_ADMIN_TOKEN``, the cache folder
    ``ZEROSERVE_CACHE_DIR`` and the storage allow-list ``ZEROSERVE_ALLOWED_STORAGE`` (comma
    separated), the names the data plane uses, so one environment configures both.
    """

    model_config = SettingsConfigDict(
        env_prefix="ZEROSERVE_CONTROL_PLANE_", frozen=True, populate_by_name=True
    )

    admin_host: str = "127.0.0.1"
    """Address the admin API binds; loopback unless the operator says otherwise."""
    admin_port: int = Field(default=8081, ge=0, le=65535)
    """Port of the admin API; 0 picks a free one."""
    admin_token: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices(
            "ZEROSERVE_ADMIN_TOKEN", "ZEROSERVE_CONTROL_PLANE_ADMIN_TOKEN", "admin_token"
        ),
    )
    """Bearer token of the admin API; ``up`` generates one when unset, standalone refuses."""
    state_url: str = "memory://"
    """``memory://`` (embedded, one process) or ``redis://host:port/db`` (cluster)."""
    backend: Literal["local", "knative"] = "local"
    """Where workers run: ``local`` child processes, or ``knative``: pods of one Knative
    Service per pool (configured by ``ZEROSERVE_KNATIVE_*``, see ``backends.knative``)."""
    pool: str = "default"
    """Name of the default worker pool: models of a backend no pool of ``extra_pools`` names
    go there. The ``worker_*``, ``max_models_per_worker``, ``max_workers`` and
    ``warm_workers`` fields describe it."""
    extra_pools: tuple[PoolSettings, ...] = ()
    """More worker pools, each for the models of the backends it names (JSON in the
    environment: ``[{"name": "vllm", "backends": ["vllm"], "device": "cuda",
    "memory_bytes": 21474836480}]``); empty: one pool takes every model."""
    cache_dir: Path = Field(
        default=Path.home() / ".cache" / "zeroserve",
        validation_alias=AliasChoices(
            "ZEROSERVE_CACHE_DIR", "ZEROSERVE_CONTROL_PLANE_CACHE_DIR", "cache_dir"
        ),
    )
    """Node-local cache folder shared by every local worker (models and engine caches)."""
    allowed_storage: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        validation_alias=AliasChoices(
            "ZEROSERVE_ALLOWED_STORAGE",
            "ZEROSERVE_CONTROL_PLANE_ALLOWED_STORAGE",
            "allowed_storage",
        ),
    )
    """Storage roots models may be registered from (``s3://bucket/prefix``, ``/abs/dir``)."""
    allow_model_code: bool = False
    """Register models that are code the workers run (Python-backend ``model.py``, PyTorch
    TorchScript and ``torch.export`` programs); off, the admin API refuses them with 422
    and workers are told to refuse such files at load. ``zeroserve up`` turns it on unless
    it is set."""
    worker_repository: Path | None = None
    """The ``--model-repository`` local workers start with; None: an empty folder in the
    cache dir (models then come only from their storage URIs)."""
    worker_device: Literal["cpu", "cuda"] = "cpu"
    """What local workers run models on; ``cuda`` models need ``cuda`` workers."""
    worker_log_dir: Path | None = None
    """Folder for local workers' logs (one file each); None: workers share our stderr."""
    worker_memory_bytes: int = Field(default=0, ge=0)
    """Memory budget for models on one worker; 0 = unbounded."""
    worker_host_memory_bytes: int = Field(default=0, ge=0)
    """Host memory on one worker for the weights of sleeping replicas (an LLM engine asleep
    keeps them there); a replica that would not fit is unloaded instead of put to sleep.
    0 = unbounded. In a cluster: the runtime pod's memory limit less what the worker and
    its loaded models need of it."""
    max_models_per_worker: int = Field(default=0, ge=0)
    """Models one worker may hold at once; 0 = unbounded (the memory budget decides)."""
    max_workers: int = Field(default=4, ge=1, le=1024)
    """Most workers the pool may have at once."""
    warm_workers: int = Field(default=0, ge=0)
    """Empty workers kept running for fast cold starts."""
    worker_template: bool = True
    """Local workers are forked from a template process that has imported the data plane
    (Linux; a worker then starts in a fraction of an interpreter's start); off, or where
    the template is unavailable, each worker is a new ``python -m data_plane`` process."""
    worker_start_timeout_s: float = Field(default=120.0, gt=0)
    """How long a new worker may take to answer its liveness probe."""
    worker_stop_timeout_s: float = Field(default=30.0, gt=0)
    """How long a worker may take to exit after SIGTERM before it is killed."""
    worker_health_interval_s: float = Field(default=2.0, gt=0)
    """Period of worker liveness probes."""
    worker_health_timeout_s: float = Field(default=5.0, gt=0)
    """Timeout of one liveness probe."""
    worker_health_failures: int = Field(default=3, ge=1)
    """Consecutive failed probes after which a worker is declared lost and killed."""
    load_timeout_s: float = Field(default=600.0, gt=0)
    """How long one model load on a worker may take."""
    unload_timeout_s: float = Field(default=120.0, gt=0)
    """How long one model unload on a worker may take (it drains accepted requests)."""
    drain_timeout_s: float = Field(default=30.0, ge=0)
    """How long a removed replica's in-flight requests may take before it is unloaded."""
    placement_propagation_s: float = Field(default=0.5, ge=0)
    """Pause between removing a placement and unloading, for activators to see the removal."""
    activation_timeout_s: float = Field(default=900.0, gt=0)
    """Bound on one whole activation: worker start plus load."""
    activation_backoff_initial_s: float = Field(default=1.0, gt=0)
    """Wait before activating a model again after an activation failed for a passing
    reason (storage unreachable, no capacity, a worker dying); doubles per failure in a
    row."""
    activation_backoff_max_s: float = Field(default=60.0, gt=0)
    """The longest such wait."""
    inspect_registrations: bool = True
    """Check each registration and change against its stored model (a listing and small
    files) and refuse, with 422, one no worker could load."""
    inspect_timeout_s: float = Field(default=20.0, gt=0)
    """Bound on one such check; past it the registration is answered 503."""
    pool_grace_period_s: float = Field(default=60.0, ge=0)
    """How long a worker with no models lives before it is stopped (beyond the warm ones)."""
    reaper_interval_s: float = Field(default=1.0, gt=0)
    """Period of the idle-model and idle-worker sweep."""
    usage_flush_s: float = Field(default=5.0, ge=0)
    """How often the reaper writes each model's changed usage ledger to the store."""
    keepalive_default_load_s: float = Field(default=10.0, gt=0, le=3600)
    """Load time the adaptive keep-alive policy assumes for a model not yet activated."""
    keepalive_min_idle_times: float = Field(default=10.0, ge=1, le=10_000)
    """Idle times the adaptive policy needs before it trusts a model's history (fewer: a
    fixed keep-alive of 10 minutes at most ``idle_timeout_s``)."""
    autoscaler_tick_s: float = Field(default=2.0, gt=0)
    """Period of the autoscaler loop."""
    stable_window_s: float = Field(default=60.0, gt=0, le=3600)
    """The autoscaler's averaging window (Knative KPA's stable window)."""
    panic_window_s: float = Field(default=6.0, gt=0, le=3600)
    """The autoscaler's burst window (KPA's panic window); at most the stable window."""
    panic_threshold: float = Field(default=2.0, ge=1.1, le=10)
    """Panic when the burst window wants this many times the ready replicas."""
    scale_down_delay_s: float = Field(default=0.0, ge=0, le=3600)
    """Hold the largest replica count of this long before scaling down; 0 disables."""
    lease_ttl_s: float = Field(default=10.0, gt=0)
    """Lifetime of the acting-replica lease; renewed every third of it."""
    activations_kept: int = Field(default=20, ge=1, le=1000)
    """Cold-start timelines kept per model."""
    console_session_s: float = Field(default=12 * 3600.0, gt=0, le=30 * 86400)
    """How long a login to the web console (``/console``) lasts."""
    follow_poll_s: float = Field(default=0.5, gt=0, le=60)
    """How often a follower of activations (``?follow=true``, the console) reads the store."""
    follow_max_s: float = Field(default=1800.0, gt=0)
    """Longest one follow of activations streams before it ends (the client may follow
    again); also how old a ``running`` timeline may be before it is taken as abandoned (its
    control plane went away mid-activation)."""
    store_retry_s: float = Field(default=1.0, gt=0)
    """Pause before a control loop retries after a state-store failure."""
    worker_metrics_timeout_s: float = Field(default=2.0, gt=0)
    """How long the admin port's ``/metrics`` waits for one local worker's page (``zeroserve
    up`` serves the workers' ``nv_*`` families there); a worker past it is left out."""
    cloudwatch_enabled: bool = False
    """Publish activation metrics to CloudWatch (PutMetricData, namespace ``zeroserve``)
    with boto3's standard AWS environment; see ``foundation.cloudwatch``."""
    cloudwatch_flush_interval_s: float = Field(default=60.0, gt=0)
    """How often buffered CloudWatch values are sent (60 s: CloudWatch's resolution)."""
    cloudwatch_max_values: int = Field(default=20_000, gt=0)
    """Distinct CloudWatch values (per minute and metric, four significant digits) held
    between two sends; past it new ones are dropped, never waited for."""

    @field_validator("allowed_storage", mode="before")
    @classmethod
    def _split_allowed(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.panic_window_s > self.stable_window_s:
            raise ValueError("panic_window_s must not exceed stable_window_s")
        if self.activation_backoff_initial_s > self.activation_backoff_max_s:
            raise ValueError(
                "activation_backoff_initial_s must not exceed activation_backoff_max_s"
            )
        if self.warm_workers > self.max_workers:
            raise ValueError("warm_workers must not exceed max_workers")
        if self.admin_token is not None and len(self.admin_token.get_secret_value()) < 8:
            raise ValueError("admin_token must be at least 8 characters")
        names = [pool.name for pool in self.all_pools]
        if len(set(names)) != len(names):
            raise ValueError(f"pool names must differ: {', '.join(names)}")
        served: set[tuple[str, str]] = set()
        for pool in self.extra_pools:
            if not pool.backends:
                raise ValueError(f"pool '{pool.name}' of extra_pools names no backends")
            for backend in pool.backends:
                if (backend, pool.device) in served:
                    # Two pools alike for a model: which one it lands on would be arbitrary.
                    raise ValueError(f"two {pool.device} pools take backend '{backend}'")
                served.add((backend, pool.device))
        return self

    @property
    def all_pools(self) -> tuple[PoolSettings, ...]:
        """Every pool, the default one first."""
        default = PoolSettings(
            name=self.pool,
            device=self.worker_device,
            memory_bytes=self.worker_memory_bytes,
            host_memory_bytes=self.worker_host_memory_bytes,
            max_models_per_worker=self.max_models_per_worker,
            max_workers=self.max_workers,
            warm_workers=self.warm_workers,
        )
        return (default, *self.extra_pools)

    def for_pool(self, pool: PoolSettings) -> Self:
        """These settings as one pool's placer reads them: the pool's fields in place of the
        default pool's."""
        return self.model_copy(
            update={
                "pool": pool.name,
                "worker_device": pool.device,
                "worker_memory_bytes": pool.memory_bytes,
                "worker_host_memory_bytes": pool.host_memory_bytes,
                "max_models_per_worker": pool.max_models_per_worker,
                "max_workers": pool.max_workers,
                "warm_workers": pool.warm_workers,
            }
        )

    @property
    def lease_renew_s(self) -> float:
        """How often the lease is renewed: a third of its lifetime."""
        return self.lease_ttl_s / 3


class AdminClientSettings(BaseSettings):
    """Where the ``zeroserve models`` client finds the admin API.

    Environment: ``ZEROSERVE_ADMIN_URL`` and ``ZEROSERVE_ADMIN_TOKEN``.
    """

    model_config = SettingsConfigDict(env_prefix="ZEROSERVE_ADMIN_", frozen=True)

    url: str = "http://127.0.0.1:8081"
    """Base URL of the admin API."""
    token: SecretStr | None = None
    """Bearer token of the admin API."""
    timeout_s: float = Field(default=660.0, gt=0)
    """Timeout of one admin call (a load waits for the model to be ready)."""
