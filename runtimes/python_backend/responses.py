"""The server's side of response senders: the requests a stub holds, and the responses
its model sends for them through a sender.

A model that is not decoupled may send its one response through a sender instead of
returning it: :class:`OpenRequests` keeps it to stand in for the execution's missing
one. A decoupled model's responses go to the request's sink as they come, and the stub
is told it may go on once the client's side has room; the request stays open past its
execution until its final response.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from foundation.errors import ZeroserveError
from runtimes.errors import InternalError
from runtimes.model_request import RequestContext, ResponseSink, StreamedResponse
from runtimes.python_backend import tensors
from runtimes.python_backend.arena import Arena
from runtimes.python_backend.messages import Message

ResponseError = Callable[[Message], ZeroserveError]
"""A response's ``{code, message}`` as the error its client gets."""


@dataclass
class OpenRequest:
    """A request the stub holds: until its execution's result, or for a decoupled one
    until its final response."""

    context: RequestContext
    sink: ResponseSink | None
    single: Message | None = None
    """The one response a model that is not decoupled sent through its sender."""


class OpenRequests:
    """The requests of a stub's executions, by ``(execution, index)``.

    ``send`` writes a message to the stub; ``is_open()`` says whether the stub still
    takes messages (not dead, not closing).
    """

    def __init__(
        self,
        outputs: Arena,
        send: Callable[[Message], None],
        is_open: Callable[[], bool],
        response_error: ResponseError | None = None,
    ) -> None:
        self._outputs = outputs
        self._send = send
        self._is_open = is_open
        self._response_error = response_error
        self._requests: dict[tuple[int, int], OpenRequest] = {}
        self._sizes: dict[int, int] = {}

    def begin(self, execution: int, contexts: Sequence[RequestContext]) -> None:
        """Execution ``execution`` holds these requests (a request with a response sink
        gets its responses there, also after the execution)."""
        for index, context in enumerate(contexts):
            self._requests[execution, index] = OpenRequest(context, context.responses)
        self._sizes[execution] = len(contexts)

    def is_cancelled(self, execution: int, index: int) -> bool:
        """Whether the client of the request went away (True once it is no longer held)."""
        request = self._requests.get((execution, index))
        return True if request is None else request.context.is_cancelled()

    def fill_in(
        self, execution: int, responses: list[Message | None] | None
    ) -> list[Message | None]:
        """The execution's returned responses, a response sent through a sender standing
        in for each missing one."""
        if (
            responses is not None
            and len(responses) >= self._sizes.get(execution, 0)
            and None not in responses
        ):
            # The common case: execute returned every response itself.
            return responses
        count = len(responses) if responses is not None else 0
        size = max(count, self._sizes.get(execution, 0))
        singles = [
            self._requests[execution, i].single if (execution, i) in self._requests else None
            for i in range(size)
        ]
        if responses is None:
            responses = [None] * len(singles)
        return [r if r is not None else singles[i] for i, r in enumerate(responses)]

    def end(self, execution: int, *, failed: bool) -> None:
        """The execution is over: forget its requests but the decoupled ones it left
        open (their responses may still come), unless it failed (or the stub died)."""
        for index in range(self._sizes.pop(execution, 0)):
            request = self._requests.get((execution, index))
            if request is None:
                continue
            if request.sink is None or failed:
                del self._requests[execution, index]

    def respond(self, message: Message) -> None:
        """A response sent through a response sender: copied out, handed on, acknowledged."""
        key = (int(message["id"]), int(message["request"]))
        arrays = {d["name"]: tensors.read(self._outputs, d) for d in message["outputs"]}
        request = self._requests.get(key)
        answer: Message = {"kind": "response_done", "call": message["call"], "error": None}
        if request is None:
            answer["error"] = "Unable to send response. Response sender has been closed."
            self._send(answer)
            return
        if request.sink is None:
            request.single = {"outputs": message["outputs"], "arrays": arrays}
            if message.get("error") is not None:
                request.single = {"error": message["error"]}
            self._send(answer)
            return
        error = message.get("error")
        final = bool(message.get("final"))
        if final:
            del self._requests[key]
        response = StreamedResponse(
            arrays if error is None else {},
            self._error_of(error) if error is not None else None,
            final,
        )
        # The stub's sender waits for this answer: sent once the client's side has room.
        request.sink(response, lambda: self._acknowledge(answer))

    def fail_all(self, reason: str) -> None:
        """The stub died: every open decoupled request ends with ``reason``."""
        requests, self._requests = self._requests, {}
        for request in requests.values():
            if request.sink is not None:
                request.sink(StreamedResponse({}, InternalError(reason), True), _nothing)

    def _acknowledge(self, answer: Message) -> None:
        if self._is_open():
            self._send(answer)

    def _error_of(self, error: Message) -> ZeroserveError:
        if self._response_error is not None:
            return self._response_error(error)
        return InternalError(str(error.get("message", "")))


def _nothing() -> None:
    return None
