"""Ensemble configs and folders for tests, in Triton's layout (``config.pbtxt`` and an empty
version folder ``1``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import cast

from foundation import datatypes
from foundation.proto import model_config_pb2 as mc
from tests.models import write_config

Tensor = tuple[str, str, Sequence[int]]
"""``(name, protocol datatype, dims)``."""


def step(
    model: str,
    inputs: Mapping[str, str],
    outputs: Mapping[str, str],
    *,
    version: int = -1,
) -> mc.ModelEnsembling.Step:
    """A step running ``model``: ``inputs`` maps its inputs from ensemble tensors,
    ``outputs`` its outputs to ensemble tensors."""
    built = mc.ModelEnsembling.Step(model_name=model, model_version=version)
    built.input_map.update(inputs)
    built.output_map.update(outputs)
    return built


def ensemble_config(
    name: str,
    steps: Sequence[mc.ModelEnsembling.Step],
    inputs: Sequence[Tensor],
    outputs: Sequence[Tensor],
    *,
    max_batch_size: int = 8,
) -> mc.ModelConfig:
    """An ensemble's config."""
    config = mc.ModelConfig(name=name, platform="ensemble", max_batch_size=max_batch_size)
    for tensor_name, datatype, dims in inputs:
        config.input.add(name=tensor_name, data_type=_type(datatype), dims=list(dims))
    for tensor_name, datatype, dims in outputs:
        config.output.add(name=tensor_name, data_type=_type(datatype), dims=list(dims))
    config.ensemble_scheduling.step.extend(steps)
    return config


def write_ensemble(repo: Path, config: mc.ModelConfig) -> Path:
    """``repo/<name>``: ``config`` and the empty version folder Triton's ensembles have."""
    model_dir = repo / config.name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    write_config(model_dir, config)
    return model_dir


def _type(datatype: str) -> mc.DataType:
    return cast(mc.DataType, datatypes.config_from_protocol(datatype))
