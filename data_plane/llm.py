"""What the LLM surfaces (OpenAI, Triton generate) share: finding the engine and SSE
framing."""

from __future__ import annotations

from typing import Any

import orjson

from data_plane.errors import InvalidArgumentError
from data_plane.repository import LoadedVersion, ModelRepository
from runtimes.capabilities import TextGenerator

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
"""Event streams must reach the client as they are written, not when a proxy's buffer fills."""


class NotALanguageModelError(InvalidArgumentError):
    """The model exists but is served by a runtime that does not generate text."""

    def __init__(self, *, model: str, kind: str) -> None:
        super().__init__(f"model '{model}' ({kind}) is not a language model")
        self.model = model


def language_model(
    repository: ModelRepository, name: str, version: int | None = None
) -> tuple[LoadedVersion, TextGenerator]:
    """The serving version of ``name`` and what generates its text.

    Raises what :meth:`ModelRepository.get` raises, and NotALanguageModelError.
    """
    model = repository.get(name, version)
    generator = model.capabilities.generation
    if generator is None:
        raise NotALanguageModelError(model=name, kind=model.runtime.kind)
    return model, generator


def sse_event(doc: Any) -> bytes:
    """One server-sent event carrying ``doc`` as JSON."""
    return b"data: " + orjson.dumps(doc) + b"\n\n"
