"""Running one request of a decoupled ensemble (one with a decoupled step): any number of
responses, as Triton 2.51's ensemble scheduler gives them.

A decoupled step answers with any number of responses; each one writes the step's
output tensors once more, and every step that reads them runs again on that write, so
each ensemble tensor holds a series of values, numbered in the order they were written
(Triton's iterations). A step runs on value ``n`` of its inputs once all of them have
one; the binding checks (:func:`data_plane.ensemble.binding.is_decoupled`) made sure
that a step's inputs, and the ensemble's outputs, all come from the same decoupled
step, so their numbers line up. Whenever the requested ensemble outputs all hold value
``n``, they go out as a response. The response that leaves no step running is the final
one; when the last thing to happen was a step ending without writing outputs, a bare
final flag closes the request, as Triton sends it (the transports decide whether a
client sees it). A step's error, or a response carrying one, ends the request with that
error, Triton's ``in ensemble '<name>', `` before it; the other steps are cancelled.

A value is dropped once every step reading it has run on it (and, for an output, once it
went out), so a long stream keeps only what is still to be read. Steps' responses wait
in a bounded queue: a client reading slowly holds up the decoupled steps' senders.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from data_plane.ensemble.step import BoundStep, ModelLookup, in_ensemble, step_request
from data_plane.errors import InternalError, ZeroserveError
from data_plane.model_version import LoadedVersion, OpenStep, RunStep
from data_plane.protocol import InferRequest, OutputTensor
from data_plane.stats import ComputeTimes
from runtimes.model_request import StreamedResponse

logger = logging.getLogger(__name__)

MAX_PENDING = 16
"""Steps' responses waiting for the request's loop before their senders are held up."""


@dataclass(slots=True)
class _Value:
    """One value an ensemble tensor took: ``array`` None where a response left the
    output out (an optional input for the steps that read it)."""

    datatype: str
    array: np.ndarray | None
    uses: int
    """Reads still to come: by the steps that read the tensor, and by the response."""


@dataclass(frozen=True, slots=True)
class _Event:
    """One response of a step: its outputs (None: a bare final flag), or its error."""

    step: BoundStep
    outputs: Mapping[str, OutputTensor] | None
    error: ZeroserveError | None
    is_final: bool


@dataclass(frozen=True, slots=True)
class Graph:
    """A decoupled ensemble's steps as the runs of its requests read them."""

    name: str
    steps: tuple[BoundStep, ...]
    readers: Mapping[str, tuple[int, ...]]
    """Ensemble tensor -> the steps that read it."""
    datatypes: Mapping[str, str]
    """Ensemble input -> its protocol datatype."""
    lookup: ModelLookup


@dataclass(frozen=True, slots=True)
class StepRunners:
    """How a run's steps reach their models: a plain model's request through
    ``run_step``, a decoupled one's through ``open_step``; ``times`` gathers the steps'
    compute times."""

    run_step: RunStep
    open_step: OpenStep
    times: ComputeTimes


class StreamedRun:
    """One ``request`` through ``graph``'s steps; iterate :meth:`responses` once.
    ``requested`` names the ensemble outputs each response carries."""

    def __init__(
        self,
        graph: Graph,
        request: InferRequest,
        requested: Sequence[str],
        runners: StepRunners,
    ) -> None:
        self._graph = graph
        self._request = request
        self._requested = tuple(requested)
        self._runners = runners
        self._values: dict[str, dict[int, _Value]] = {}
        self._written: dict[str, int] = {}
        """Tensor -> how many values it took so far (the next one's number)."""
        self._events: asyncio.Queue[_Event] = asyncio.Queue(MAX_PENDING)
        self._tasks: set[asyncio.Task[None]] = set()
        self._running = 0
        """Steps started and not yet answered with their final response."""

    @property
    def held_count(self) -> int:
        """Values held for steps or responses still to read them."""
        return sum(len(values) for values in self._values.values())

    async def responses(
        self, inputs: Mapping[str, np.ndarray]
    ) -> AsyncGenerator[StreamedResponse, None]:
        """The ensemble's responses to the request, whose ``inputs`` were checked
        against its config; the last one final (an error is final). Closing the iterator
        early cancels the steps still running."""
        try:
            written = []
            for name, datatype in self._graph.datatypes.items():
                written.append((name, self._write(name, datatype, inputs.get(name))))
            self._start_ready(written)
            if not self._running:
                yield StreamedResponse({}, None, True)
                return
            while self._running:
                event = await self._events.get()
                if event.is_final:
                    self._running -= 1
                if event.error is not None:
                    yield StreamedResponse({}, in_ensemble(self._graph.name, event.error), True)
                    return
                written = [] if event.outputs is None else self._publish(event)
                self._start_ready(written)
                answers = self._answers(written)
                for index, outputs in enumerate(answers):
                    is_last = index == len(answers) - 1
                    yield StreamedResponse(outputs, None, is_last and not self._running)
                if not answers and not self._running:
                    yield StreamedResponse({}, None, True)
        finally:
            await self._cancel()

    def _write(self, tensor: str, datatype: str, array: np.ndarray | None) -> int:
        """Record the tensor's next value; its number."""
        number = self._written.get(tensor, 0)
        self._written[tensor] = number + 1
        uses = len(self._graph.readers.get(tensor, ())) + (tensor in self._requested)
        if uses:
            self._values.setdefault(tensor, {})[number] = _Value(datatype, array, uses)
        return number

    def _publish(self, event: _Event) -> list[tuple[str, int]]:
        """Write ``event``'s outputs as the next values of the tensors they map to (a
        missing output as a value without data, as Triton records it)."""
        assert event.outputs is not None
        written = []
        for model_output, tensor in event.step.outputs:
            output = event.outputs.get(model_output)
            if output is None:
                written.append((tensor, self._write(tensor, "", None)))
            else:
                written.append((tensor, self._write(tensor, output.datatype, output.data)))
        return written

    def _start_ready(self, written: list[tuple[str, int]]) -> None:
        """Start every step that ``written`` gave all its inputs, each on the values
        of that number, in step order."""
        steps = self._graph.steps
        ready: set[tuple[int, int]] = set()
        for tensor, number in written:
            for index in self._graph.readers.get(tensor, ()):
                if all(number in self._values.get(t, {}) for _, t in steps[index].inputs):
                    ready.add((index, number))
        for index, number in sorted(ready):
            step = steps[index]
            call = self._call(step, self._step_request(step, number))
            name = f"ensemble-{self._graph.name}-{index}-{number}"
            task = asyncio.create_task(call, name=name)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            self._running += 1

    def _step_request(self, step: BoundStep, number: int) -> InferRequest:
        """The request of ``step`` on values ``number`` of its inputs, which it reads
        for the last time then."""
        given = []
        for model_input, tensor in step.inputs:
            value = self._values[tensor][number]
            if value.array is not None:
                given.append((model_input, value.datatype, value.array))
        for tensor in dict.fromkeys(t for _, t in step.inputs):
            self._release(tensor, number)
        return step_request(step, given, self._request)

    def _release(self, tensor: str, number: int) -> None:
        values = self._values[tensor]
        value = values[number]
        value.uses -= 1
        if not value.uses:
            del values[number]

    def _answers(self, written: list[tuple[str, int]]) -> list[dict[str, np.ndarray]]:
        """The responses ``written`` completes: for each number written to a requested
        output, the requested outputs, when all of them hold that value with data."""
        numbers = dict.fromkeys(n for t, n in written if t in self._requested)
        answers = []
        for number in numbers:
            values = [self._values.get(t, {}).get(number) for t in self._requested]
            if any(v is None or v.array is None for v in values):
                continue
            answer = {}
            for tensor, value in zip(self._requested, values, strict=True):
                assert value is not None and value.array is not None
                answer[tensor] = value.array
                self._release(tensor, number)
            answers.append(answer)
        return answers

    async def _call(self, step: BoundStep, request: InferRequest) -> None:
        """Run ``step``, each of its responses (the last final) or its error an event."""
        try:
            model = self._graph.lookup(step.model, step.version)
            if step.is_decoupled:
                await self._stream(step, model, request)
            else:
                produced = await self._runners.run_step(model, request, self._runners.times)
                await self._events.put(_Event(step, {o.name: o for o in produced}, None, True))
        except ZeroserveError as exc:
            await self._events.put(_Event(step, None, exc, True))
        except Exception as exc:
            logger.exception("step %d of ensemble %s failed", step.index, self._graph.name)
            error = InternalError(str(exc) or type(exc).__name__)
            await self._events.put(_Event(step, None, error, True))

    async def _stream(self, step: BoundStep, model: LoadedVersion, request: InferRequest) -> None:
        stream = self._runners.open_step(model, request, self._runners.times)
        async with contextlib.aclosing(stream):
            async for answer in stream:
                if answer.error is not None:
                    await self._events.put(_Event(step, None, answer.error, True))
                    return
                is_bare = answer.is_final and not answer.outputs
                outputs = None if is_bare else {o.name: o for o in answer.outputs}
                await self._events.put(_Event(step, outputs, None, answer.is_final))
                if answer.is_final:
                    return
        raise InternalError(f"model '{step.model}' ended its responses without a final one")

    async def _cancel(self) -> None:
        tasks = set(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
