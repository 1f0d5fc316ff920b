"""Triton's generate extension on LLM runtimes: a prompt in, its completion out, whole or
as it is generated.

The prompt's completion follows the prompt in ``text_output`` unless the request excludes
the input; streamed answers carry the new text only. Everything that can be refused with a
status (a draining server, an unknown model or one that is not a language model, a full
engine, a prompt too long) is refused before a stream starts.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from data_plane.errors import ModelNotReadyError, ServerStoppingError
from data_plane.llm import language_model
from data_plane.repository import LoadedVersion, ModelRepository
from data_plane.state import Lifecycle
from runtimes.capabilities import TextGenerator
from runtimes.sampling import Delta, SamplingParams

_ABORTED = "the generation was aborted (the model is going away)"


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    """A decoded generate request."""

    prompt: str
    sampling: SamplingParams
    exclude_input: bool = False
    """Leave the prompt out of the whole answer's ``text_output``."""
    id: str | None = None


@dataclass(frozen=True, slots=True)
class GenerateResponse:
    """A whole answer, or one event of a streamed one."""

    model_name: str
    model_version: str
    id: str | None
    text_output: str


@dataclass(frozen=True, slots=True)
class LanguageModel:
    """A serving model version and what generates its text."""

    version: LoadedVersion
    runtime: TextGenerator


class GenerateHandler:
    """Runs generate requests, whatever the transport.

    A caller that goes away cancels the awaited call, or closes the stream, which aborts the
    generation in its engine.
    """

    def __init__(self, repository: ModelRepository, lifecycle: Lifecycle) -> None:
        self._repository = repository
        self._lifecycle = lifecycle

    def check_accepting(self) -> None:
        """ServerStoppingError while the server drains. :meth:`model` checks it itself; a
        transport calls it first when it must refuse before anything else."""
        if self._lifecycle.is_stopping:
            raise ServerStoppingError()

    def model(self, name: str, version: int | None = None) -> LanguageModel:
        """The language model a request for ``name`` goes to: ServerStoppingError while the
        server drains, then what :meth:`ModelRepository.get` raises, and
        NotALanguageModelError."""
        self.check_accepting()
        loaded, runtime = language_model(self._repository, name, version)
        return LanguageModel(loaded, runtime)

    async def generate(self, model: LanguageModel, request: GenerateRequest) -> GenerateResponse:
        """The whole answer."""
        deltas = await self._start(model, request)
        async with contextlib.aclosing(_checked(deltas)) as stream:
            text = "".join([delta.text async for delta in stream])
        if not request.exclude_input:
            text = request.prompt + text
        return _response(model, request, text)

    async def generate_stream(
        self, model: LanguageModel, request: GenerateRequest
    ) -> AsyncGenerator[GenerateResponse, None]:
        """The answer as it is generated, one response per piece of new text (and one for
        the finish). Raises before returning for what can be refused; the stream raises
        the data plane's errors, and others, when the generation fails."""
        deltas = await self._start(model, request)
        return _events(model, request, deltas)

    async def _start(
        self, model: LanguageModel, request: GenerateRequest
    ) -> AsyncGenerator[Delta, None]:
        prompt_ids = await model.runtime.encode(request.prompt)
        return model.runtime.generate(prompt_ids, request.sampling)


async def _checked(deltas: AsyncGenerator[Delta, None]) -> AsyncGenerator[Delta, None]:
    """``deltas``, closed when done or abandoned; ModelNotReadyError for an aborted one."""
    async with contextlib.aclosing(deltas) as stream:
        async for delta in stream:
            if delta.finish_reason == "abort":
                raise ModelNotReadyError(_ABORTED)
            yield delta


async def _events(
    model: LanguageModel, request: GenerateRequest, deltas: AsyncGenerator[Delta, None]
) -> AsyncGenerator[GenerateResponse, None]:
    # Each layer closes the one below, so that a consumer closing this stream aborts the
    # generation at once rather than when the garbage collector finalizes the layers.
    async with contextlib.aclosing(_checked(deltas)) as stream:
        async for delta in stream:
            if delta.text or delta.finish_reason is not None:
                yield _response(model, request, delta.text)


def _response(model: LanguageModel, request: GenerateRequest, text: str) -> GenerateResponse:
    return GenerateResponse(
        model_name=model.version.name,
        model_version=str(model.version.version),
        id=request.id,
        text_output=text,
    )
