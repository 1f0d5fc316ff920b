"""The data plane's error tree, free of HTTP.

    ZeroserveError
    ├── InvalidArgumentError          the request is wrong (Triton INVALID_ARG)
    │   ├── UnknownModelError         a name the repository has never heard of
    │   └── InvalidParameterError     one named parameter is wrong (LLM sampling, prompt)
    │       └── ContextLengthError    prompt plus completion exceed the model's context
    ├── NotFoundError                 a known model without the version asked for
    ├── UnavailableError              try again later (Triton UNAVAILABLE)
    │   ├── ModelNotReadyError        loading, unloading or failed
    │   ├── QueueFullError            the batcher's queue for a priority level is full
    │   ├── RequestTimeoutError       the request waited in the queue past its timeout
    │   └── ServerStoppingError       the server is draining for shutdown
    ├── UnsupportedError              a feature we do not offer (Triton UNSUPPORTED)
    ├── ModelLoadError                a load failed; the model stays unloaded
    └── InternalError                 an engine failed while running a batch
        └── EngineDeadError           the engine cannot recover; the worker must be replaced

`data_plane.http_errors` maps each class to a status code in one place. Messages follow the
texts Triton gives so that tools matching on them keep working.
"""

from __future__ import annotations


class ZeroserveError(Exception):
    """Base of every error the data plane raises on purpose."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgumentError(ZeroserveError):
    """The request cannot be served as written: bad JSON, shape, datatype or parameter."""


class UnknownModelError(InvalidArgumentError):
    """The repository holds no model of this name (Triton answers 400 here, not 404)."""

    def __init__(self, *, model: str) -> None:
        super().__init__(f"Request for unknown model: '{model}' is not found")
        self.model = model


class InvalidParameterError(InvalidArgumentError):
    """One request parameter is missing, of the wrong type or out of range.

    ``param`` names it as the client wrote it (``temperature``, ``messages``), so that the
    OpenAI surface can report it in its ``param`` field; ``code`` is OpenAI's error code
    when it has one for the case.
    """

    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ContextLengthError(InvalidParameterError):
    """The prompt and the tokens asked for do not fit the model's context window."""

    code = "context_length_exceeded"

    def __init__(self, *, max_model_len: int, prompt_tokens: int, max_tokens: int) -> None:
        super().__init__(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, "
            f"{max_tokens} for the completion). Please reduce the length of the prompt or "
            "max_tokens.",
            param="max_tokens" if prompt_tokens < max_model_len else "prompt",
        )
        self.max_model_len = max_model_len
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens


class NotFoundError(ZeroserveError):
    """A known model has no available version matching the request."""


class UnavailableError(ZeroserveError):
    """The server cannot serve this now; a retry later may succeed."""

    retry_after_s: int = 1


class ModelNotReadyError(UnavailableError):
    """The model version exists but is not READY (loading, unloading, failed)."""


class QueueFullError(UnavailableError):
    """The batcher queue of the request's priority level is at ``max_queue_size``."""

    def __init__(self, *, request_id: str | None = None) -> None:
        super().__init__(f"{request_prefix(request_id)}Exceeds maximum queue size")


class RequestTimeoutError(UnavailableError):
    """The request's queue timeout expired before it was placed in a batch."""

    def __init__(self, *, request_id: str | None = None) -> None:
        super().__init__(f"{request_prefix(request_id)}Request timeout expired")


class ServerStoppingError(UnavailableError):
    """The server is shutting down and takes no new inference requests."""

    def __init__(self) -> None:
        super().__init__(
            "Server is stopping, scheduler for model has stopped accepting new inference requests"
        )


class UnsupportedError(ZeroserveError):
    """The request asks for something this server does not implement."""


class ModelLoadError(ZeroserveError):
    """Loading a model failed; the message says why and the model stays unloaded."""

    def __init__(self, *, model: str, reason: str) -> None:
        super().__init__(f"load failed for model '{model}': {reason}")
        self.model = model
        self.reason = reason


class InternalError(ZeroserveError):
    """The engine failed while executing a batch."""


class EngineDeadError(InternalError):
    """The engine stopped for good (a crashed generation loop, a dead vLLM core).

    Requests fail with 500; the server marks itself unready and exits, so that its
    supervisor (the local backend, Kubernetes) replaces the process (STYLE C15).
    """


def request_prefix(request_id: str | None) -> str:
    """Triton's prefix for request-scoped errors: ``[request id: <id>] ``."""
    return f"[request id: {request_id or '<id_unknown>'}] "
