"""OpenAI's request bodies, checked, and its error body.

Requests are parsed by hand rather than with a schema library: each check names the field
as OpenAI does (``param``), unknown fields are refused (a typo is reported, not ignored), and
fields OpenAI defines that this server does not implement are accepted only at their
"off" values (``n: 1``, ``logprobs: null``, no tools), with a message saying so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from data_plane.errors import InvalidParameterError
from runtimes.llm.base import DEFAULT_MAX_TOKENS
from runtimes.sampling import SamplingParams, sampling_from_mapping

_SAMPLING: Final = frozenset({"max_tokens", "temperature", "top_p", "stop", "seed"})
_COMMON: Final = _SAMPLING | {
    "model",
    "n",
    "stream",
    "stream_options",
    "user",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
}
_COMPLETION_FIELDS: Final = _COMMON | {"prompt", "echo", "best_of", "suffix"}
_CHAT_FIELDS: Final = _COMMON | {
    "messages",
    "max_completion_tokens",
    "top_logprobs",
    "response_format",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
}
_ROLES: Final = frozenset({"system", "developer", "user", "assistant", "tool"})


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    """``POST /v1/completions``, checked."""

    model: str
    prompt: str | list[int]
    """Text, or token ids."""
    sampling: SamplingParams
    stream: bool
    include_usage: bool
    """``stream_options.include_usage``: a last chunk with the usage."""
    echo: bool


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """``POST /v1/chat/completions``, checked."""

    model: str
    messages: list[dict[str, str]]
    """Role and text content of each message (content parts joined)."""
    sampling: SamplingParams
    stream: bool
    include_usage: bool


def parse_completion(body: bytes) -> CompletionRequest:
    """The completion request in ``body``; raises InvalidParameterError."""
    doc = _object(body, _COMPLETION_FIELDS)
    _off(doc, "best_of", (None, 1))
    _off(doc, "suffix", (None, ""))
    _off(doc, "logprobs", (None,))
    return CompletionRequest(
        model=_model(doc),
        prompt=_prompt(doc.get("prompt")),
        sampling=sampling_from_mapping(doc, default_max_tokens=DEFAULT_MAX_TOKENS),
        stream=_bool(doc, "stream"),
        include_usage=_include_usage(doc),
        echo=_bool(doc, "echo"),
    )


def parse_chat(body: bytes) -> ChatRequest:
    """The chat completion request in ``body``; raises InvalidParameterError."""
    doc = _object(body, _CHAT_FIELDS)
    _off(doc, "logprobs", (None, False))
    _off(doc, "top_logprobs", (None, 0))
    _off(doc, "tool_choice", (None, "none"))
    _off(doc, "parallel_tool_calls", (None, True, False))
    if doc.get("tools"):
        raise InvalidParameterError("tools are not supported by this server", param="tools")
    response_format = doc.get("response_format")
    if response_format not in (None, {"type": "text"}):
        raise InvalidParameterError(
            'only response_format {"type": "text"} is supported', param="response_format"
        )
    sampling_doc = dict(doc)
    if doc.get("max_completion_tokens") is not None:
        if doc.get("max_tokens") is not None:
            raise InvalidParameterError(
                "give max_tokens or max_completion_tokens, not both", param="max_tokens"
            )
        sampling_doc["max_tokens"] = doc["max_completion_tokens"]
    return ChatRequest(
        model=_model(doc),
        messages=_messages(doc.get("messages")),
        # A chat reply may fill the context window unless the client caps it (OpenAI's rule).
        sampling=sampling_from_mapping(sampling_doc, default_max_tokens=None),
        stream=_bool(doc, "stream"),
        include_usage=_include_usage(doc),
    )


def error_body(
    message: str, *, error_type: str, param: str | None = None, code: str | int | None = None
) -> dict[str, Any]:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def _object(body: bytes, fields: frozenset[str]) -> dict[str, Any]:
    if not body.strip():
        raise InvalidParameterError("the request body is empty; expected a JSON object")
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidParameterError(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidParameterError("the request body must be a JSON object")
    unknown = sorted(set(doc) - fields)
    if unknown:
        raise InvalidParameterError(
            f"Unrecognized request argument supplied: {', '.join(unknown)}", param=unknown[0]
        )
    _off(doc, "n", (None, 1))
    for penalty in ("presence_penalty", "frequency_penalty"):
        _off(doc, penalty, (None, 0, 0.0))
    if doc.get("logit_bias"):
        raise InvalidParameterError("logit_bias is not supported", param="logit_bias")
    user = doc.get("user")
    if user is not None and not isinstance(user, str):
        raise InvalidParameterError("user must be a string", param="user")
    return doc


def _off(doc: Mapping[str, Any], key: str, allowed: Sequence[object]) -> None:
    """Refuse a value of ``key`` this server does not implement."""
    value = doc.get(key)
    # `True in (1,)` holds in Python; JSON true is never the number 1 here.
    if any(value == a and type(value) is type(a) for a in allowed) or value is None:
        return
    shown = ", ".join("null" if a is None else orjson.dumps(a).decode() for a in allowed)
    raise InvalidParameterError(
        f"{key}={orjson.dumps(value).decode()} is not supported; this server takes {shown}",
        param=key,
    )


def _model(doc: Mapping[str, Any]) -> str:
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidParameterError("model must be a non-empty string", param="model")
    return model


def _bool(doc: Mapping[str, Any], key: str) -> bool:
    value = doc.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidParameterError(f"{key} must be a boolean", param=key)
    return value


def _include_usage(doc: Mapping[str, Any]) -> bool:
    options = doc.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict) or set(options) - {"include_usage", "continuous_usage_stats"}:
        raise InvalidParameterError(
            'stream_options must be an object like {"include_usage": true}',
            param="stream_options",
        )
    if not doc.get("stream"):
        raise InvalidParameterError(
            "stream_options is only allowed when stream is true", param="stream_options"
        )
    return _bool(options, "include_usage")


def _prompt(value: Any) -> str | list[int]:
    # One prompt per request: a list holding a single prompt is accepted as that prompt.
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]
    if isinstance(value, str):
        return value
    if (
        isinstance(value, list)
        and value
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)
    ):
        return list(value)
    if isinstance(value, list) and len(value) > 1 and all(isinstance(v, str) for v in value):
        raise InvalidParameterError(
            "this server takes one prompt per request; send the prompts separately",
            param="prompt",
        )
    raise InvalidParameterError(
        "prompt must be a string or a non-empty list of token ids", param="prompt"
    )


def _messages(value: Any) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise InvalidParameterError("messages must be a non-empty list", param="messages")
    messages = []
    for index, message in enumerate(value):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise InvalidParameterError(f"{where} must be an object", param=where)
        role = message.get("role")
        if role not in _ROLES:
            raise InvalidParameterError(
                f"{where}.role must be one of {sorted(_ROLES)}", param=f"{where}.role"
            )
        messages.append({"role": role, "content": _content(message.get("content"), where)})
    return messages


def _content(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, list):
        parts = []
        for part in value:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise InvalidParameterError(
                    f"{where}.content: only text parts are supported", param=f"{where}.content"
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise InvalidParameterError(
                    f"{where}.content: a text part needs a string 'text'", param=f"{where}.content"
                )
            parts.append(text)
        return "".join(parts)
    raise InvalidParameterError(
        f"{where}.content must be a string or a list of text parts", param=f"{where}.content"
    )
