"""Inference: find the model version a request names, then run a decoded request on it.

Two steps because transports must resolve the model before they decode the request: the
decoder's error texts name the model, and a request for an unknown model or a draining
server is refused before its body is read.

Inputs and outputs in shared memory are read and written here (see
`data_plane.handlers.shared_memory`), so every transport gets them by passing the requests'
parameters through.
"""

from __future__ import annotations

from dataclasses import dataclass

from data_plane import inference
from data_plane.errors import InvalidArgumentError, ServerStoppingError, UnsupportedError
from data_plane.handlers.shared_memory import SharedMemoryHandlers
from data_plane.protocol import InferRequest, OutputTensor
from data_plane.repository import LoadedVersion, ModelRepository
from data_plane.response_stream import ResponseStream
from data_plane.state import Lifecycle
from data_plane.trace import TraceManager


# Not frozen: built once per request on the hot path, where a frozen dataclass's __init__
# (object.__setattr__ per field) costs about three times as much.
@dataclass(slots=True)
class InferResponse:
    """The answer to one infer request: the outputs it asked for, in its order."""

    model_name: str
    model_version: str
    id: str | None
    outputs: list[OutputTensor]


class InferHandler:
    """Runs infer requests, whatever the transport."""

    def __init__(
        self,
        repository: ModelRepository,
        lifecycle: Lifecycle,
        shared_memory: SharedMemoryHandlers,
        tracer: TraceManager | None = None,
    ) -> None:
        self._repository = repository
        self._lifecycle = lifecycle
        self._shared_memory = shared_memory
        self._tracer = tracer

    def model(self, name: str, version: int | None = None) -> LoadedVersion:
        """The serving version a request for ``name`` (and ``version``) goes to.

        Raises ServerStoppingError while the server drains, then what
        :meth:`ModelRepository.get` raises.
        """
        if self._lifecycle.is_stopping:
            raise ServerStoppingError()
        return self._repository.get(name, version)

    async def infer(self, model: LoadedVersion, request: InferRequest) -> InferResponse:
        """Validate ``request`` against ``model``'s config, batch it, run it and pick its
        outputs; raises the data plane's errors (InvalidArgumentError for a request that
        does not fit the model, UnavailableError when it cannot be queued or timed out, and
        the shared-memory errors of ``data_plane.shared_memory`` for its regions)."""
        if request.uses_shared_memory:
            async with self._shared_memory.place(request, model.name) as placed:
                outputs = await inference.infer(model, request, self._tracer)
                await placed.write(outputs)
        else:
            outputs = await inference.infer(model, request, self._tracer)
        return InferResponse(
            model_name=model.name,
            model_version=str(model.version),
            id=request.id,
            outputs=outputs,
        )

    def stream(self, model: LoadedVersion, request: InferRequest) -> ResponseStream:
        """The responses of a decoupled ``model`` to ``request``, as they come; raises now
        what the request alone is refused for (see :func:`inference.open_stream`).
        Shared-memory inputs and outputs are not offered on streams."""
        if request.uses_shared_memory:
            raise InvalidArgumentError(
                f"model '{model.name}' is decoupled: its requests cannot use shared memory here"
            )
        return inference.open_stream(model, request)

    def check_not_decoupled(self, model: LoadedVersion, message: str) -> None:
        """UnsupportedError with ``message`` (the transport's Triton text) for a decoupled
        model, whose answers only a stream can carry."""
        if model.config.model_transaction_policy.decoupled:
            raise UnsupportedError(message)
