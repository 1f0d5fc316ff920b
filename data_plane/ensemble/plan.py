"""What a load of an ensemble will build, read from its folder: the config (checked as
Triton checks an ensemble's config on its own), the versions, the composing models."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from data_plane.ensemble.step import BoundStep
from data_plane.errors import ModelPollError
from data_plane.storage import CachedModel
from foundation import ensemble_config, model_config
from foundation.proto.model_config_pb2 import ModelConfig


@dataclass(frozen=True)
class EnsemblePlan:
    """An ensemble's load, worked out off the event loop."""

    model_dir: Path
    config: ModelConfig
    """Normalized and checked on its own (not yet against the composing models)."""
    versions: list[int]
    fingerprint: str
    """The folder's digest and the complete config: the same means nothing changed."""
    composing: tuple[str, ...]
    """The models the steps run, each once."""
    steps: tuple[BoundStep, ...] = ()
    """The steps checked against the composing models: set once those are loaded."""


def plan_ensemble(
    name: str,
    cached: CachedModel,
    *,
    config_override: str | None,
    is_named_by_load: bool,
) -> EnsemblePlan | None:
    """The plan for ``name`` if its config (``config_override`` or config.pbtxt) makes it
    an ensemble; None for any other model, and for a config that cannot be read, whose
    error the ordinary load path gives. Blocking: run it in a thread.

    ``is_named_by_load``: as for any model, a model given by storage URI takes the load's
    name. Raises ModelPollError for an ensemble config Triton would refuse.
    """
    model_dir = cached.path
    try:
        if config_override is not None:
            config = model_config.parse_json(config_override)
        else:
            config = model_config.read_config_file(model_dir) or ModelConfig()
    except (model_config.ConfigError, OSError):
        return None
    if not ensemble_config.is_ensemble(config):
        return None
    if is_named_by_load and config_override is None:
        config.name = name
    try:
        # normalize applies Triton's checks of an ensemble's own config.
        model_config.normalize(config, name=name, gpu_count=0)
        versions = model_config.versions_to_load(model_dir, config)
    except (model_config.ConfigError, OSError) as exc:
        raise ModelPollError(model=name, reason=str(exc)) from exc
    fingerprint = hashlib.sha256(
        cached.digest.encode() + config.SerializeToString(deterministic=True)
    ).hexdigest()
    return EnsemblePlan(
        model_dir=model_dir,
        config=config,
        versions=versions,
        fingerprint=fingerprint,
        composing=ensemble_config.composing_models(config),
    )
