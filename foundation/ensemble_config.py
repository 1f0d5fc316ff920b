"""Ensemble configurations (``platform: "ensemble"``): their steps, and Triton's checks of
the data flow a config describes on its own, before any composing model is looked at.

An ensemble's ``ensemble_scheduling`` lists steps; each names a composing model (and a
version, -1 for the latest) and maps that model's inputs from, and its outputs to, the
ensemble's tensors. The ensemble's inputs feed the first steps, and every tensor a step
writes may feed later ones, so the steps form a graph, not a sequence.

:func:`check_scheduling` refuses what Triton refuses when it reads such a config (a
step without a model, a tensor written twice, an input nobody reads, an output nobody
writes, a cycle, which leaves outputs unwritten), with Triton's texts; the checks that
need the composing models' configs run in the data plane once those are loaded. The
control plane reads :func:`composing_models` to place an ensemble with its parts.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Final

from foundation.proto.model_config_pb2 import ModelConfig

ENSEMBLE_PLATFORM: Final = "ensemble"
"""Triton's ``platform`` value for an ensemble."""

LATEST_VERSION: Final = -1
"""A step's ``model_version`` that means the composing model's latest serving version."""


class EnsembleConfigError(ValueError):
    """An ensemble configuration that breaks Triton's rules; the message is Triton's."""


@dataclass(frozen=True, slots=True)
class EnsembleStep:
    """One step of an ensemble: which model runs, and how its tensors map to the
    ensemble's."""

    index: int
    """The step's place in the config (Triton's error texts count from 0)."""
    model: str
    version: int | None
    """The composing model's version; None for the latest serving one."""
    inputs: tuple[tuple[str, str], ...]
    """``(model input, ensemble tensor)`` pairs, in the config's order."""
    outputs: tuple[tuple[str, str], ...]
    """``(model output, ensemble tensor)`` pairs, in the config's order."""


def is_ensemble(config: ModelConfig) -> bool:
    """Whether ``config`` describes an ensemble (by platform, as Triton decides)."""
    return config.platform == ENSEMBLE_PLATFORM


def steps_of(config: ModelConfig) -> tuple[EnsembleStep, ...]:
    """The steps of ``config``'s ``ensemble_scheduling``, in order."""
    return tuple(
        EnsembleStep(
            index=index,
            model=step.model_name,
            version=None if step.model_version < 0 else int(step.model_version),
            inputs=tuple(step.input_map.items()),
            outputs=tuple(step.output_map.items()),
        )
        for index, step in enumerate(config.ensemble_scheduling.step)
    )


def composing_models(config: ModelConfig) -> tuple[str, ...]:
    """The names of the models ``config``'s steps run, each once, in order of first use."""
    return tuple(dict.fromkeys(step.model_name for step in config.ensemble_scheduling.step))


def check_scheduling(config: ModelConfig) -> None:
    """Refuse an ensemble config, or an ``ensemble_scheduling`` on a model that is not an
    ensemble, as Triton does when it reads the config (its texts, its order of checks).

    ``config`` is normalized: its name set, no instance group added (an ensemble has
    none). Raises EnsembleConfigError.
    """
    name = config.name
    has_scheduling = config.HasField("ensemble_scheduling")
    if not is_ensemble(config):
        if has_scheduling:
            raise EnsembleConfigError(
                f"ensemble scheduling cannot be set for model '{name}' whose platform is not "
                f"{ENSEMBLE_PLATFORM}"
            )
        return
    if not has_scheduling:
        raise EnsembleConfigError(
            f"ensemble scheduling must be set for ensemble {name} whose platform is "
            f"{ENSEMBLE_PLATFORM}"
        )
    if config.instance_group:
        raise EnsembleConfigError(f"instance group should not be specified for ensemble '{name}'")
    if config.HasField("optimization"):
        raise EnsembleConfigError(f"optimization should not be specified for ensemble '{name}'")
    if config.model_warmup:
        raise EnsembleConfigError(f"model_warmup can not be specified for ensemble '{name}'")
    if not config.ensemble_scheduling.step:
        raise EnsembleConfigError(f"must specify 'step' for ensemble '{name}'")
    graph = _TensorGraph.of(config)
    graph.check_flow(config)


@dataclass
class _Tensor:
    """An ensemble tensor: who writes it (``sources``: the writing step's inputs) and
    whom it feeds."""

    name: str
    is_written: bool = False
    is_ready: bool = False
    sources: list[_Tensor] | None = None
    consumers: list[_Tensor] | None = None

    def feeds(self, tensor: _Tensor) -> None:
        if self.consumers is None:
            self.consumers = []
        self.consumers.append(tensor)
        if tensor.sources is None:
            tensor.sources = []
        tensor.sources.append(self)


class _TensorGraph:
    """The data flow between ensemble tensors: a tensor a step writes depends on every
    tensor that step reads."""

    def __init__(self) -> None:
        self.tensors: dict[str, _Tensor] = {}

    @classmethod
    def of(cls, config: ModelConfig) -> _TensorGraph:
        graph = cls()
        name = config.name
        for index, step in enumerate(config.ensemble_scheduling.step):
            if not step.model_name:
                raise EnsembleConfigError(
                    f"must specify 'model_name' in step {index} of ensemble '{name}'"
                )
            if not step.input_map:
                raise EnsembleConfigError(
                    f"must specify 'input_map' in step {index} of ensemble '{name}'"
                )
            if not step.output_map:
                raise EnsembleConfigError(
                    f"must specify 'output_map' in step {index} of ensemble '{name}'"
                )
            written: list[_Tensor] = []
            for tensor_name in step.output_map.values():
                tensor = graph.tensor(tensor_name)
                if tensor.is_written:
                    raise EnsembleConfigError(
                        f"ensemble tensor '{tensor_name}' can appear in an output map only "
                        f"once for ensemble '{name}' step {index}"
                    )
                tensor.is_written = True
                written.append(tensor)
            # input_map is a map: a model input cannot be named twice in one step.
            for tensor_name in step.input_map.values():
                read = graph.tensor(tensor_name)
                for tensor in written:
                    read.feeds(tensor)
        return graph

    def tensor(self, name: str) -> _Tensor:
        tensor = self.tensors.get(name)
        if tensor is None:
            tensor = self.tensors[name] = _Tensor(name)
        return tensor

    def check_flow(self, config: ModelConfig) -> None:
        """Triton's walk from the ensemble's inputs: every input is read, every output is
        reached, and every other tensor is reached and read."""
        name = config.name
        frontier: deque[_Tensor] = deque()
        for source in config.input:
            tensor = self.tensors.get(source.name)
            if tensor is None:
                # Triton's text, stray quote included.
                raise EnsembleConfigError(
                    f"ensemble input '{source.name}' for ensemble {name}' is not used"
                )
            tensor.is_ready = True
            frontier.append(tensor)
        while frontier:
            for consumer in frontier.popleft().consumers or ():
                if consumer.is_ready:
                    continue
                if all(source.is_ready for source in consumer.sources or ()):
                    consumer.is_ready = True
                    frontier.append(consumer)
        outputs: set[str] = set()
        for spec in config.output:
            tensor = self.tensors.get(spec.name)
            if tensor is None:
                raise EnsembleConfigError(
                    f"ensemble output '{spec.name}' for ensemble {name}' is not used"
                )
            if not tensor.is_ready:
                message = f"output '{spec.name}' for ensemble '{name}' is not written"
                cause = _unconnected_source(tensor)
                if cause is not tensor:
                    message += (
                        f": at least one of its depending tensors, '{cause.name}', is not connected"
                    )
                raise EnsembleConfigError(message)
            outputs.add(spec.name)
        for tensor in self.tensors.values():
            if tensor.name in outputs:
                continue
            if not tensor.is_ready or not tensor.consumers:
                raise EnsembleConfigError(
                    f"ensemble tensor '{tensor.name}' is unused in ensemble '{name}'"
                )


def _unconnected_source(tensor: _Tensor) -> _Tensor:
    """The deepest tensor an unreached ``tensor`` waits on, following the first unreached
    source at each level (a cycle stops at a tensor already seen), as Triton reports it."""
    seen: set[str] = set()
    found = tensor
    sources = tensor.sources
    while sources:
        following = None
        for source in sources:
            if not source.is_ready and source.name not in seen:
                seen.add(source.name)
                found = source
                following = source.sources
                break
        sources = following
    return found
