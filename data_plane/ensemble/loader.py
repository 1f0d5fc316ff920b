"""Loading an ensemble as Triton does: its composing models first (loaded if they are
not serving), then the checks against them, then its versions; and keeping ensembles in
step with the models they use (out of service with them, back with them).

The repository calls :meth:`EnsembleLoader.prepare` once a load's plan says the model
is an ensemble, :meth:`EnsembleLoader.build` for each of its versions,
:meth:`EnsembleLoader.before_unload` before any model is unloaded and
:meth:`EnsembleLoader.after_load` after any model loaded. Failures read as Triton's
``load failed for model '<name>': <reason>``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Protocol

from data_plane.batcher import Batcher, BatchPolicy
from data_plane.ensemble.binding import EnsembleBindingError, bind_steps, is_decoupled
from data_plane.ensemble.dependencies import Dependencies, EnsembleCycleError
from data_plane.ensemble.plan import EnsemblePlan
from data_plane.ensemble.runtime import EnsembleRuntime
from data_plane.ensemble.scheduler import Ensemble
from data_plane.ensemble.step import ModelLookup
from data_plane.errors import ModelLoadError, ZeroserveError
from data_plane.instances import Instances
from data_plane.model_version import LoadedVersion, TensorSpec
from data_plane.reshape import TensorReshape
from data_plane.stats import ModelStats
from foundation.datatypes import protocol_from_config
from foundation.ensemble_config import steps_of
from foundation.proto.model_config_pb2 import ModelConfig
from runtimes.base import RuntimeOptions

logger = logging.getLogger(__name__)


class LoadModel(Protocol):
    """Load a model (joining a load of it in progress), as the repository's load API."""

    async def __call__(self, name: str, /) -> object: ...


class UnloadModel(Protocol):
    """Unload a model, as the repository's unload API."""

    async def __call__(self, name: str, /) -> None: ...


class EnsembleLoader:
    """The repository's part in ensembles: ``lookup`` finds serving versions (the
    repository's ``get``), ``load`` loads a composing model; ``drain_timeout_s`` bounds
    how long an unloaded ensemble lets its requests finish."""

    def __init__(self, lookup: ModelLookup, load: LoadModel, *, drain_timeout_s: float) -> None:
        self._lookup = lookup
        self._load = load
        self._options = RuntimeOptions(drain_timeout_s=drain_timeout_s)
        self.dependencies = Dependencies()

    async def prepare(self, plan: EnsemblePlan) -> EnsemblePlan:
        """Load what ``plan``'s ensemble uses and check it against that; the plan with
        its steps bound. Raises ModelLoadError with Triton's text."""
        name = plan.config.name
        previous = self.dependencies.uses_of(name)
        try:
            self.dependencies.declare(name, plan.composing)
        except EnsembleCycleError as exc:
            raise _load_error(name, str(exc)) from exc
        try:
            for model in plan.composing:
                await self._ensure_loaded(name, model)
            for step in steps_of(plan.config):
                if step.version is not None and not self._is_serving(step.model, step.version):
                    raise _load_error(
                        name,
                        f"ensemble '{name}' depends on '{step.model}' whose required version "
                        f"{step.version} is not loaded.",
                    )
            try:
                steps = bind_steps(plan.config, self._config_of)
                decoupled = is_decoupled(plan.config, steps)
            except EnsembleBindingError as exc:
                raise _load_error(name, str(exc)) from exc
        except BaseException:
            self.dependencies.restore(name, previous)
            raise
        config = ModelConfig()
        config.CopyFrom(plan.config)
        # Triton sets the policy from the steps, whatever the config said.
        config.model_transaction_policy.decoupled = decoupled
        return dataclasses.replace(plan, config=config, steps=tuple(steps))

    async def build(self, version: int, plan: EnsemblePlan) -> LoadedVersion:
        """Version ``version`` of a prepared ensemble, serving."""
        started = time.monotonic()
        config = ModelConfig()
        config.CopyFrom(plan.config)
        name = config.name
        inputs = {
            t.name: TensorSpec(t.name, protocol_from_config(t.data_type), tuple(t.dims), t.optional)
            for t in config.input
        }
        outputs = {
            t.name: TensorSpec(t.name, protocol_from_config(t.data_type), tuple(t.dims))
            for t in config.output
        }
        ensemble = Ensemble(
            name,
            plan.steps,
            {spec.name: spec.datatype for spec in inputs.values()},
            tuple(outputs),
            self._lookup,
        )
        runtime = EnsembleRuntime(ensemble, name=name, version=version, options=self._options)
        await runtime.load(plan.model_dir / str(version), config, "cpu")
        capabilities = runtime.resolve_capabilities()
        instances = Instances([(runtime, capabilities, 1)])
        return LoadedVersion(
            name=name,
            version=version,
            config=config,
            instances=instances,
            capabilities=capabilities,
            # Never started or fed: an ensemble's requests queue at its composing models.
            batcher=Batcher(instances.infer, BatchPolicy()),
            stats=ModelStats(),
            inputs=inputs,
            outputs=outputs,
            load_duration_s=time.monotonic() - started,
            reshape=TensorReshape.from_config(config),
            ensemble=ensemble,
        )

    async def before_unload(self, model: str, unload: UnloadModel) -> None:
        """``model`` is being unloaded on purpose: the ensembles that use it go out of
        service first (to come back with it), and it, if an ensemble, uses nothing now."""
        self.dependencies.forget(model)
        for user in self.dependencies.users_of(model):
            uses = self.dependencies.uses_of(user)
            await unload(user)
            if uses is not None:
                self.dependencies.park(user, uses)
            logger.info("unloaded ensemble %s with %s, which it uses", user, model)

    async def after_load(self, model: str) -> None:
        """``model`` serves again: load the ensembles that went out of service with it,
        once everything they use serves. Their failures are logged, not raised: the load
        of ``model`` succeeded."""
        for user in self.dependencies.waiting_on(model):
            uses = self.dependencies.uses_of(user) or ()
            if not all(self._is_serving(used) for used in uses):
                continue
            try:
                await self._load(user)
            except ZeroserveError as exc:
                logger.warning("ensemble %s did not come back with %s: %s", user, model, exc)

    async def _ensure_loaded(self, ensemble: str, model: str) -> None:
        if self._is_serving(model):
            return
        try:
            await self._load(model)
        except ModelLoadError as exc:
            cycle = exc.__cause__
            if isinstance(cycle, EnsembleCycleError):
                seen = cycle.seen_from(ensemble)
                if seen is not None:
                    raise _load_error(ensemble, str(seen)) from seen
            raise _load_error(
                ensemble,
                f"ensemble {ensemble} contains models that are not available or ambiguous: {model}",
            ) from exc
        except ZeroserveError as exc:
            raise _load_error(
                ensemble,
                f"ensemble {ensemble} contains models that are not available or ambiguous: {model}",
            ) from exc

    def _is_serving(self, model: str, version: int | None = None) -> bool:
        try:
            self._lookup(model, version)
        except ZeroserveError:
            return False
        return True

    def _config_of(self, model: str, version: int | None) -> ModelConfig:
        return self._lookup(model, version).config


def _load_error(ensemble: str, reason: str) -> ModelLoadError:
    # Triton's dependency errors end with a newline, as its failed loads do.
    return ModelLoadError(model=ensemble, reason=f"{reason}\n")
