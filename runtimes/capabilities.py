"""What a loaded runtime offers beyond load, infer and unload, as typed capability objects.

A runtime answers :meth:`~runtimes.base.ModelRuntime.resolve_capabilities` once, after its
load, with a :class:`Capabilities`: each field is the object that offers that capability
(usually the runtime itself, seen through a narrow Protocol) or None. The data plane keeps
the answer beside the loaded version and asks it, so that no code above the runtimes tests
for a concrete runtime class to find out whether a model generates text, sleeps, can die
or reports generation metrics.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from runtimes.model_request import FailureReporter, RequestExecutor
from runtimes.sampling import Delta, EngineLoad, FinishReason, SamplingParams


class TextGenerator(Protocol):
    """A language model: tokenize, stream completions, and say how busy it is.

    Every method is called from the event loop.
    """

    @property
    def max_model_len(self) -> int:
        """Context window in tokens (prompt plus completion)."""
        ...

    @property
    def in_flight(self) -> int:
        """Generations started through :meth:`generate` and not ended."""
        ...

    async def encode(self, text: str) -> list[int]:
        """Token ids of a completion prompt (with the tokenizer's special tokens)."""
        ...

    async def encode_chat(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """Token ids of a chat rendered with the model's template, ready for the reply;
        InvalidParameterError (``messages``) when there is no template or it refuses."""
        ...

    async def decode(self, token_ids: Sequence[int]) -> str:
        """The text of ``token_ids`` (special tokens left out)."""
        ...

    def check_prompt(self, prompt_ids: Sequence[int]) -> None:
        """InvalidParameterError (``prompt``) for an empty prompt or unknown token ids."""
        ...

    def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, request_id: str | None = None
    ) -> AsyncGenerator[Delta, None]:
        """Stream the completion of ``prompt_ids``; the last delta has a finish reason.

        Admission is checked before the stream is returned (ModelNotReadyError,
        QueueFullError, InvalidParameterError, ContextLengthError), so that a caller can
        still answer with a status. Closing the stream early aborts the generation.
        """
        ...

    def load_counts(self) -> EngineLoad:
        """Requests running and waiting in the engine now (cheap)."""
        ...


class Sleeper(Protocol):
    """Puts a loaded engine to sleep (device memory freed, weights kept) and back."""

    async def sleep(self) -> None:
        """Refuse new requests, drain those in flight (bounded), then sleep; idempotent."""
        ...

    async def wake(self) -> None:
        """Serve again as before the sleep; idempotent."""
        ...


class EngineHealth(Protocol):
    """An engine that can die for good (a crashed engine process, vLLM's dead engine)."""

    @property
    def is_dead(self) -> bool:
        """The engine stopped for good; the server should exit so that it is replaced."""
        ...


@dataclass(frozen=True, slots=True)
class GenerationRecord:
    """What one finished (or aborted) generation took, for metrics."""

    prompt_tokens: int
    completion_tokens: int
    finish_reason: FinishReason
    e2e_s: float
    """From the request entering the engine to its last token."""
    first_token_s: float | None
    """Time to the first token; None when none came."""
    token_gaps_s: tuple[float, ...] = field(default=())
    """Time between consecutive token-bearing steps (inter-token latency samples)."""


class GenerationObserver(Protocol):
    """Told about every generation as it ends (the data plane's LLM metrics)."""

    def __call__(self, record: GenerationRecord) -> None: ...


class GenerationMetrics(Protocol):
    """Reports each generation as it ends, and the engine's queues when asked."""

    observer: GenerationObserver | None
    """Told about each generation as it ends; set by the server after the load."""

    def load_counts(self) -> EngineLoad:
        """Requests running and waiting in the engine now (cheap: read at every scrape)."""
        ...


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What one loaded runtime offers; None where it does not."""

    generation: TextGenerator | None = None
    """Text generation (the OpenAI and Triton generate surfaces)."""
    sleep: Sleeper | None = None
    """A sleeping state between loaded and unloaded."""
    health: EngineHealth | None = None
    """An engine whose death the server watches for."""
    generation_metrics: GenerationMetrics | None = None
    """Per-generation latencies and token counts, and engine queue gauges."""
    requests: RequestExecutor | None = None
    """Batches run as their separate requests (Triton Python-backend models)."""
    failure: FailureReporter | None = None
    """An engine that can fail on its own (a crashed process) while the server lives."""
