"""Running one ensemble request: each step as soon as the tensors it reads exist.

The steps form a graph (:mod:`foundation.ensemble_config`), so independent steps run at
the same time and a step waits only for the steps that write what it reads. Each step is
an ordinary infer request on its composing model, sent through ``run_step`` (the path a
client's request takes: the model's validation, its batcher, its statistics), so a
composing model batches the steps of concurrent ensemble requests with its other
traffic. Tensors pass from step to step as the arrays they are: nothing is encoded or
copied between steps in this process.

A step's error fails the request with Triton's words, ``in ensemble '<name>', `` before
the step's own message, and the same kind (so the same status); the steps still running
are cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Mapping, Sequence

import numpy as np

from data_plane.ensemble.step import BoundStep, ModelLookup, in_ensemble, step_request
from data_plane.ensemble.streaming import Graph, StepRunners, StreamedRun
from data_plane.errors import InternalError, ZeroserveError
from data_plane.model_version import OpenStep, RunStep
from data_plane.protocol import InferRequest, OutputTensor
from data_plane.stats import ComputeTimes
from runtimes.model_request import StreamedResponse

__all__ = ["BoundStep", "Ensemble", "ModelLookup", "in_ensemble"]

logger = logging.getLogger(__name__)


class Ensemble:
    """One ensemble version's steps, and the requests running through them.

    ``steps`` come checked (:mod:`data_plane.ensemble.binding`), their data flow valid:
    every step's inputs are written by earlier-finishing steps or are ensemble inputs,
    and running every step writes every ensemble output. ``input_datatypes`` gives each
    ensemble input's protocol datatype.
    """

    def __init__(
        self,
        name: str,
        steps: Sequence[BoundStep],
        input_datatypes: Mapping[str, str],
        outputs: Sequence[str],
        lookup: ModelLookup,
    ) -> None:
        self.name = name
        self.steps = tuple(steps)
        self._input_datatypes = dict(input_datatypes)
        self._outputs = tuple(outputs)
        self._lookup = lookup
        readers: dict[str, list[int]] = {}
        for step in self.steps:
            for tensor in dict.fromkeys(t for _, t in step.inputs):
                readers.setdefault(tensor, []).append(step.index)
        self._readers = {tensor: tuple(indices) for tensor, indices in readers.items()}
        """Ensemble tensor -> the steps that read it."""
        self._needs = tuple(
            len({t for _, t in step.inputs if t not in self._input_datatypes})
            for step in self.steps
        )
        """Per step, how many tensors it reads that steps write (not ensemble inputs)."""
        self._first = tuple(step for step in self.steps if self._needs[step.index] == 0)
        self._graph = Graph(name, self.steps, self._readers, self._input_datatypes, lookup)
        self._running = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def running_count(self) -> int:
        """Requests going through the steps now."""
        return self._running

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the requests running now to finish; whether they
        did."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    async def run(
        self,
        inputs: Mapping[str, np.ndarray],
        request: InferRequest,
        run_step: RunStep,
        times: ComputeTimes,
    ) -> dict[str, np.ndarray]:
        """Run every step for ``request``, whose ``inputs`` were checked against the
        ensemble's config; return the ensemble's outputs by name. ``times`` gathers the
        steps' compute times. Raises the first failing step's error as the ensemble
        reports it."""
        self._running += 1
        self._idle.clear()
        try:
            return await self._run(inputs, request, run_step, times)
        except ZeroserveError as exc:
            raise in_ensemble(self.name, exc) from exc
        finally:
            self._running -= 1
            if not self._running:
                self._idle.set()

    async def stream(
        self,
        inputs: Mapping[str, np.ndarray],
        request: InferRequest,
        run_step: RunStep,
        open_step: OpenStep,
        times: ComputeTimes,
    ) -> AsyncGenerator[StreamedResponse, None]:
        """The responses of a decoupled ensemble (:mod:`data_plane.ensemble.streaming`)
        to ``request``, the last one final; errors come as final responses carrying
        them, as the ensemble reports them."""
        requested = (
            self._outputs if request.outputs is None else tuple(o.name for o in request.outputs)
        )
        run = StreamedRun(self._graph, request, requested, StepRunners(run_step, open_step, times))
        self._running += 1
        self._idle.clear()
        try:
            responses = run.responses(inputs)
            async with contextlib.aclosing(responses):
                async for response in responses:
                    yield response
        finally:
            self._running -= 1
            if not self._running:
                self._idle.set()

    async def _run(
        self,
        inputs: Mapping[str, np.ndarray],
        request: InferRequest,
        run_step: RunStep,
        times: ComputeTimes,
    ) -> dict[str, np.ndarray]:
        tensors: dict[str, tuple[str, np.ndarray]] = {
            name: (self._input_datatypes[name], array) for name, array in inputs.items()
        }
        needs = list(self._needs)
        ready = list(self._first)
        running: dict[asyncio.Task[list[OutputTensor]], BoundStep] = {}
        try:
            while ready or running:
                if len(ready) == 1 and not running:
                    # A step with nothing beside it (a chain): awaited here, no task.
                    step = ready.pop()
                    produced = await self._call(step, tensors, request, run_step, times)
                    self._publish(step, produced, tensors, needs, ready)
                    continue
                for step in ready:
                    call = self._call(step, tensors, request, run_step, times)
                    task = asyncio.create_task(call, name=f"ensemble-{self.name}-{step.index}")
                    running[task] = step
                ready.clear()
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                # Step order, so that of two steps failing together the earlier one speaks.
                for task in sorted(done, key=lambda t: running[t].index):
                    step = running.pop(task)
                    self._publish(step, task.result(), tensors, needs, ready)
        finally:
            if running:
                for task in running:
                    task.cancel()
                await asyncio.wait(running)
        return {name: tensors[name][1] for name in self._outputs}

    async def _call(
        self,
        step: BoundStep,
        tensors: Mapping[str, tuple[str, np.ndarray]],
        request: InferRequest,
        run_step: RunStep,
        times: ComputeTimes,
    ) -> list[OutputTensor]:
        model = self._lookup(step.model, step.version)
        given = []
        for model_input, tensor in step.inputs:
            entry = tensors.get(tensor)
            if entry is None:
                continue  # an optional ensemble input the request left out
            given.append((model_input, *entry))
        sent = step_request(step, given, request)
        return await run_step(model, sent, times)

    def _publish(
        self,
        step: BoundStep,
        produced: list[OutputTensor],
        tensors: dict[str, tuple[str, np.ndarray]],
        needs: list[int],
        ready: list[BoundStep],
    ) -> None:
        """Make ``step``'s outputs ensemble tensors, and queue the steps that now have
        everything they read."""
        by_name = {output.name: output for output in produced}
        for model_output, tensor in step.outputs:
            output = by_name.get(model_output)
            if output is None:
                raise InternalError(
                    f"model '{step.model}' did not produce output '{model_output}' (ensemble "
                    f"tensor '{tensor}')"
                )
            tensors[tensor] = (output.datatype, output.data)
            if tensor in self._input_datatypes:
                continue  # an ensemble input a step rewrites: its readers never waited on it
            for reader in self._readers.get(tensor, ()):
                needs[reader] -= 1
                if not needs[reader]:
                    ready.append(self.steps[reader])
