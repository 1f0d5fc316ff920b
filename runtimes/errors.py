"""The data plane's branch of the error tree: Triton's error kinds, free of HTTP.

It lives here, below the data plane, because the runtimes raise these kinds too;
``data_plane.errors`` adds the leaves only the data plane raises and names the whole
branch for the data plane and for model code (``model.py`` raises them from there).

    ZeroserveError                    foundation.errors: the one root
    └── DataPlaneError
        ├── InvalidArgumentError      the request is wrong (Triton INVALID_ARG)
        │   └── InvalidParameterError one named parameter is wrong (LLM sampling, prompt)
        │       └── ContextLengthError prompt plus completion exceed the model's context
        ├── NotFoundError             what was asked for is not there: a model version, or
        │   │                         a Python model's NOT_FOUND response
        │   └── UnknownModelError     a name the server has never heard of (data_plane)
        ├── UnavailableError          try again later (Triton UNAVAILABLE)
        │   ├── ModelNotReadyError    loading, unloading or failed
        │   ├── QueueFullError        a queue for the request is full
        │   ├── RequestTimeoutError   the request waited in the queue past its timeout (data_plane)
        │   └── ServerStoppingError   the server is draining for shutdown (data_plane)
        ├── UnsupportedError          a feature we do not offer (Triton UNSUPPORTED)
        │   └── UnsupportedCompressionError  a Content-Encoding we do not decode (data_plane)
        ├── ModelLoadError            a load failed; the model stays unloaded
        │   └── ModelPollError        its folder or config could not be read (data_plane)
        ├── InternalError             an engine failed while running a batch
        │   └── EngineDeadError       the engine cannot recover; the worker must be replaced
        └── StorageError              a model could not be fetched (data_plane.storage.errors)

The kinds keep Triton's names (its status codes), so they are the data plane's alone: the
activator and the control plane name theirs after themselves. ``data_plane.http_errors``
maps each class to a status code in one place. Messages follow the texts Triton gives so
that tools matching on them keep working.
"""

from __future__ import annotations

from foundation.errors import ZeroserveError


class DataPlaneError(ZeroserveError):
    """Base of every error a worker raises on purpose: its runtimes and its server."""


class InvalidArgumentError(DataPlaneError):
    """The request cannot be served as written: bad JSON, shape, datatype or parameter."""


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


class NotFoundError(DataPlaneError):
    """What the request names is not there: a known model without the version asked for
    (the data plane), or what a Python model's ``TritonError.NOT_FOUND`` says (Triton's
    NOT_FOUND)."""


class UnavailableError(DataPlaneError):
    """The server cannot serve this now; a retry later may succeed."""

    retry_after_s: int = 1


class ModelNotReadyError(UnavailableError):
    """The model version exists but is not READY (loading, unloading, failed)."""


class QueueFullError(UnavailableError):
    """A queue for the request is full: the batcher's for its priority level (at
    ``max_queue_size``), or an LLM engine's."""

    def __init__(self, *, request_id: str | None = None) -> None:
        super().__init__(f"{request_prefix(request_id)}Exceeds maximum queue size")


class UnsupportedError(DataPlaneError):
    """The request asks for something this server does not implement."""


class ModelLoadError(DataPlaneError):
    """Loading a model failed; the message says why and the model stays unloaded."""

    def __init__(self, *, model: str, reason: str) -> None:
        super().__init__(f"load failed for model '{model}': {reason}")
        self.model = model
        self.reason = reason


class InternalError(DataPlaneError):
    """The engine failed while executing a batch."""


class EngineDeadError(InternalError):
    """The engine stopped for good (a crashed generation loop, a dead vLLM core).

    Requests fail with 500; the server marks itself unready and exits, so that its
    supervisor (the local backend, Kubernetes) replaces the process (STYLE C15).
    """


def request_prefix(request_id: str | None) -> str:
    """Triton's prefix for request-scoped errors: ``[request id: <id>] ``."""
    return f"[request id: {request_id or '<id_unknown>'}] "
