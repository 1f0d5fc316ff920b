"""The data plane's settings: one frozen object, loaded once in ``__main__``."""

from __future__ import annotations

import enum
from pathlib import Path

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class ModelControlMode(enum.StrEnum):
    """Triton's model control modes (``poll`` is not offered)."""

    NONE = "none"
    EXPLICIT = "explicit"


class DataPlaneSettings(BaseSettings):
    """How one inference server process runs. Environment: ``ZEROSERVE_DATA_PLANE_*``."""

    model_config = SettingsConfigDict(env_prefix="ZEROSERVE_DATA_PLANE_", frozen=True)

    model_repository: Path
    """Folder in Triton's layout: ``<model>/config.pbtxt`` and ``<model>/<version>/``."""
    host: str = "127.0.0.1"
    """Address the HTTP server binds."""
    http_port: int = Field(default=8000, ge=0, le=65535)
    """Port of the HTTP server; 0 picks a free one."""
    model_control_mode: ModelControlMode = ModelControlMode.NONE
    """``none`` loads every model at start; ``explicit`` loads only what is asked for."""
    load_models: tuple[str, ...] = ()
    """Models to load at start in explicit mode; ``*`` loads all."""
    cache_dir: Path | None = Field(
        default=None,
        validation_alias=AliasChoices("ZEROSERVE_CACHE_DIR", "cache_dir"),
    )
    """Node-local cache folder (engine caches)."""
    max_input_bytes: int = Field(default=64 * 2**20, gt=0)
    """Largest request body (after decompression), as Triton's --http-max-input-size."""
    exit_timeout_s: float = Field(default=30.0, ge=0)
    """How long in-flight requests may take to finish on shutdown or unload."""
    readiness_propagation_s: float = Field(default=0.0, ge=0)
    """Pause between failing readiness and refusing requests on shutdown (load balancers)."""
    batcher_queue_bound: int = Field(default=4096, gt=0)
    """Hard bound on queued requests per model version, whatever its config says."""
    intra_op_threads: int = Field(default=0, ge=0)
    """Threads per engine operator; 0 lets the engine choose."""
    inter_op_threads: int = Field(default=0, ge=0)
    """Threads across engine operators; 0 lets the engine choose."""
    gpu_count: int | None = Field(default=None, ge=0)
    """GPUs this server may use; None detects them."""

    @field_validator("load_models")
    @classmethod
    def _no_empty_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if any(not name for name in value):
            raise ValueError("--load-model needs a model name")
        return value
