"""The data plane's settings: one frozen object, loaded once in ``__main__``."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from data_plane.trace.settings import TraceConfig
from foundation.grpc_limits import GrpcLimits
from foundation.http import ServerLimits


class ModelControlMode(enum.StrEnum):
    """Triton's model control modes."""

    NONE = "none"
    EXPLICIT = "explicit"
    POLL = "poll"


class DataPlaneSettings(BaseSettings, ServerLimits, TraceConfig, GrpcLimits):
    """How one inference server process runs. Environment: ``ZEROSERVE_DATA_PLANE_*``.

    The HTTP server's connection limits are `ServerLimits`'; the start-up trace settings
    (Triton's ``--trace-config``, ``ZEROSERVE_DATA_PLANE_TRACE_FILE``...) `TraceConfig`'s; the
    gRPC server's message sizes and keepalive (Triton's ``--grpc-*`` flags) `GrpcLimits`'.
    """

    model_config = SettingsConfigDict(env_prefix="ZEROSERVE_DATA_PLANE_", frozen=True)

    model_repository: str
    """Triton-layout repository (``<model>/config.pbtxt``, ``<model>/<version>/``): a local
    folder, ``file://`` URI or ``s3://bucket/prefix``."""
    host: str = "127.0.0.1"
    """Address the HTTP server binds."""
    http_port: int = Field(default=8000, ge=0, le=65535)
    """Port of the HTTP server; 0 picks a free one."""
    grpc_port: int = Field(default=8001, ge=0, le=65535)
    """Port of the gRPC server (Triton's default); 0 serves no gRPC."""
    metrics_port: int = Field(default=8002, ge=0, le=65535)
    """Port serving ``/metrics`` alone (Triton's ``--metrics-port`` and default); 0 keeps
    metrics on the HTTP port only. ``/metrics`` is on the HTTP port either way."""
    allow_metrics: bool = True
    """Serve ``/metrics`` at all (Triton's ``--allow-metrics``); false answers 404 on the
    HTTP port and opens no metrics port."""
    max_header_bytes: int = Field(default=80 * 1024, ge=1024)
    """Largest request line and headers together, then 431: above the activator's (64 KiB),
    which forwards what it accepted, with the proxies on the way adding a few headers."""
    max_headers: int = Field(default=128, ge=8)
    """Most header fields in one request, then 431: above the activator's (100), as above."""
    model_control_mode: ModelControlMode = ModelControlMode.NONE
    """``none`` loads every model at start; ``explicit`` loads only what is asked for;
    ``poll`` loads every model at start and follows the repository's changes."""
    repository_poll_s: float = Field(default=15.0, gt=0)
    """Seconds between two scans of the repository in poll mode (Triton's
    ``--repository-poll-secs``)."""
    server_id: str = Field(default="triton", min_length=1)
    """The server's name in its metadata (Triton's ``--id``; its default, as
    ``data_plane.handlers.server.SERVER_NAME`` says why)."""
    model_warmup_timeout_s: float = Field(default=600.0, gt=0)
    """Bound on the ``model_warmup`` runs of one model version, all samples together."""
    load_models: tuple[str, ...] = ()
    """Models to load at start in explicit mode; ``*`` loads all."""
    cache_dir: Path = Field(
        default_factory=lambda: Path.home() / ".cache" / "zeroserve",
        validation_alias=AliasChoices("ZEROSERVE_CACHE_DIR", "cache_dir"),
    )
    """Node-local cache folder: fetched models and warm engines, shared by the node's workers."""
    cache_max_bytes: int = Field(
        default=50 * 2**30,
        gt=0,
        validation_alias=AliasChoices("ZEROSERVE_CACHE_MAX_BYTES", "cache_max_bytes"),
    )
    """Bound on the node cache's size; least recently used models not in use are evicted."""
    allowed_storage: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        validation_alias=AliasChoices("ZEROSERVE_ALLOWED_STORAGE", "allowed_storage"),
    )
    """Roots (``s3://bucket[/prefix]``, folders) a load's ``storage_uri`` may name; comma
    separated in the environment. The model repository is always allowed."""
    storage_part_size_bytes: int = Field(default=8 * 2**20, ge=64 * 1024)
    """Size of one ranged GET from S3."""
    storage_concurrency: int = Field(default=8, ge=1, le=256)
    """Ranged GETs in flight at once."""
    storage_connect_timeout_s: float = Field(default=5.0, gt=0)
    """Connect timeout to the object store."""
    storage_read_timeout_s: float = Field(default=30.0, gt=0)
    """Read timeout on an open connection to the object store."""
    storage_lock_timeout_s: float = Field(default=600.0, gt=0)
    """How long to wait for another process fetching the same model."""
    max_input_bytes: int = Field(default=64 * 2**20, gt=0)
    """Largest request body (after decompression), as Triton's --http-max-input-size."""
    exit_timeout_s: float = Field(default=30.0, ge=0)
    """How long in-flight requests may take to finish on shutdown or unload."""
    readiness_propagation_s: float = Field(default=0.0, ge=0)
    """Pause between failing readiness and refusing requests on shutdown (load balancers)."""
    response_cache_bytes: int = Field(default=0, ge=0)
    """Size of the server-wide response cache, which models whose config sets
    ``response_cache { enable: true }`` use (Triton's ``--cache-config local,size=N``);
    0 runs none."""
    batcher_queue_bound: int = Field(default=4096, gt=0)
    """Hard bound on queued requests per model version, whatever its config says."""
    intra_op_threads: int = Field(default=0, ge=0)
    """Threads per engine operator; 0 lets the engine choose."""
    inter_op_threads: int = Field(default=0, ge=0)
    """Threads across engine operators; 0 lets the engine choose."""
    gpu_count: int | None = Field(default=None, ge=0)
    """GPUs this server may use; None detects them."""
    engine_watchdog_interval_s: float = Field(default=1.0, gt=0)
    """How often LLM engines are checked for an unrecoverable failure (the server then
    fails readiness and exits, to be replaced)."""

    @field_validator("allowed_storage", mode="before")
    @classmethod
    def _split_roots(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("load_models")
    @classmethod
    def _no_empty_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if any(not name for name in value):
            raise ValueError("--load-model needs a model name")
        return value

    @model_validator(mode="after")
    def _poll_needs_a_folder(self) -> DataPlaneSettings:
        if self.model_control_mode is ModelControlMode.POLL and "://" in self.model_repository:
            if not self.model_repository.startswith("file://"):
                raise ValueError("poll mode needs a local model repository (a folder)")
        return self
