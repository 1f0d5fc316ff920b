"""Completions and chat completions: from a checked request to OpenAI's answer.

Transport-free: :func:`complete` and :func:`chat` return either the whole answer (a dict)
or, for ``stream: true``, an async iterator of server-sent events ending with
``data: [DONE]``. Everything that can fail with a status code (unknown model, bad
parameters, a prompt too long, a full engine) fails before the iterator is returned; what
fails once the stream runs becomes a last ``error`` event, since the status line has gone.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any, Final

from data_plane.errors import ModelNotReadyError, ZeroserveError
from data_plane.http_errors import status_for
from data_plane.llm import language_model, sse_event
from data_plane.openai.protocol import ChatRequest, CompletionRequest, error_body
from data_plane.repository import ModelRepository
from runtimes.capabilities import TextGenerator
from runtimes.sampling import Delta, FinishReason, SamplingParams

logger = logging.getLogger(__name__)

DONE: Final = b"data: [DONE]\n\n"

Answer = dict[str, Any] | AsyncIterator[bytes]
"""A whole response body, or the events of a streamed one."""


@dataclass(frozen=True, slots=True)
class _Call:
    """One request on its way to the engine."""

    id: str
    created: int
    model: str
    runtime: TextGenerator
    prompt_ids: list[int]
    sampling: SamplingParams
    include_usage: bool


async def complete(repository: ModelRepository, request: CompletionRequest) -> Answer:
    """``POST /v1/completions``."""
    _, runtime = language_model(repository, request.model)
    if isinstance(request.prompt, str):
        prompt_text = request.prompt
        prompt_ids = await runtime.encode(prompt_text)
    else:
        runtime.check_prompt(request.prompt)
        prompt_ids = request.prompt
        prompt_text = await runtime.decode(prompt_ids)
    call = _call("cmpl", request.model, runtime, prompt_ids, request.sampling, request)
    echo = prompt_text if request.echo else ""
    if request.stream:
        return _completion_events(call, _start(call), echo)
    text, reason, tokens = await _collect(_start(call))
    return {
        "id": call.id,
        "object": "text_completion",
        "created": call.created,
        "model": call.model,
        "choices": [{"index": 0, "text": echo + text, "logprobs": None, "finish_reason": reason}],
        "usage": _usage(len(prompt_ids), tokens),
    }


async def chat(repository: ModelRepository, request: ChatRequest) -> Answer:
    """``POST /v1/chat/completions``."""
    _, runtime = language_model(repository, request.model)
    prompt_ids = await runtime.encode_chat(request.messages)
    call = _call("chatcmpl", request.model, runtime, prompt_ids, request.sampling, request)
    if request.stream:
        return _chat_events(call, _start(call))
    text, reason, tokens = await _collect(_start(call))
    return {
        "id": call.id,
        "object": "chat.completion",
        "created": call.created,
        "model": call.model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": reason,
            }
        ],
        "usage": _usage(len(prompt_ids), tokens),
    }


def models(repository: ModelRepository) -> dict[str, Any]:
    """``GET /v1/models``: the language models serving here."""
    now = int(time.time())
    data = [
        {
            "id": model.name,
            "object": "model",
            "created": now,
            "owned_by": "zeroserve",
            "max_model_len": generator.max_model_len,
        }
        for model in repository.all_serving()
        if (generator := model.capabilities.generation) is not None
    ]
    return {"object": "list", "data": data}


def _call(
    kind: str,
    model: str,
    runtime: TextGenerator,
    prompt_ids: list[int],
    sampling: SamplingParams,
    request: CompletionRequest | ChatRequest,
) -> _Call:
    return _Call(
        id=f"{kind}-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=model,
        runtime=runtime,
        prompt_ids=prompt_ids,
        sampling=sampling,
        include_usage=request.include_usage,
    )


def _start(call: _Call) -> AsyncGenerator[Delta, None]:
    # Admission (readiness, queue bound, context length) is checked here, before a stream
    # begins, so that its failures are still status codes.
    return call.runtime.generate(call.prompt_ids, call.sampling, request_id=call.id)


async def _collect(deltas: AsyncGenerator[Delta, None]) -> tuple[str, FinishReason, int]:
    parts: list[str] = []
    tokens = 0
    reason: FinishReason = "abort"
    async with contextlib.aclosing(deltas) as stream:
        async for delta in stream:
            parts.append(delta.text)
            tokens += delta.tokens
            if delta.finish_reason is not None:
                reason = delta.finish_reason
    if reason == "abort":
        raise ModelNotReadyError("the generation was aborted (the model is going away)")
    return "".join(parts), reason, tokens


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


async def _completion_events(
    call: _Call, deltas: AsyncGenerator[Delta, None], echo: str
) -> AsyncIterator[bytes]:
    def chunk(text: str, reason: str | None) -> bytes:
        return sse_event(
            {
                "id": call.id,
                "object": "text_completion",
                "created": call.created,
                "model": call.model,
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}],
            }
        )

    if echo:
        yield chunk(echo, None)
    async for event in _events(call, deltas, chunk, "text_completion"):
        yield event


async def _chat_events(call: _Call, deltas: AsyncGenerator[Delta, None]) -> AsyncIterator[bytes]:
    def chunk(text: str, reason: str | None, delta: dict[str, str] | None = None) -> bytes:
        if delta is None:
            delta = {"content": text} if text else {}
        return sse_event(
            {
                "id": call.id,
                "object": "chat.completion.chunk",
                "created": call.created,
                "model": call.model,
                "choices": [
                    {
                        "index": 0,
                        "delta": delta,
                        "logprobs": None,
                        "finish_reason": reason,
                    }
                ],
            }
        )

    yield chunk("", None, {"role": "assistant", "content": ""})
    async for event in _events(call, deltas, chunk, "chat.completion.chunk"):
        yield event


async def _events(
    call: _Call,
    deltas: AsyncGenerator[Delta, None],
    chunk: Any,
    kind: str,
) -> AsyncIterator[bytes]:
    """The events of one streamed generation, then usage (if asked) and ``[DONE]``.

    Cancelling the iteration (the client left) closes ``deltas``, which aborts the request
    in the engine.
    """
    tokens = 0
    try:
        async with contextlib.aclosing(deltas) as stream:
            async for delta in stream:
                tokens += delta.tokens
                reason = delta.finish_reason
                if reason == "abort":
                    raise ModelNotReadyError("the generation was aborted (the model is going away)")
                if delta.text or reason is not None:
                    yield chunk(delta.text, reason)
    except ZeroserveError as exc:
        logger.warning("generation %s failed mid-stream: %s", call.id, exc.message)
        yield sse_event(error_body(exc.message, error_type="server_error", code=_code(exc)))
    except Exception:
        logger.exception("generation %s failed mid-stream", call.id)
        yield sse_event(error_body("internal server error", error_type="server_error", code=500))
    else:
        if call.include_usage:
            yield sse_event(
                {
                    "id": call.id,
                    "object": kind,
                    "created": call.created,
                    "model": call.model,
                    "choices": [],
                    "usage": _usage(len(call.prompt_ids), tokens),
                }
            )
    yield DONE


def _code(exc: ZeroserveError) -> int:
    return status_for(exc)
