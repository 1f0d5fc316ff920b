"""What a model in a stub asks of the server while it runs: send a response through a
response sender, call another model (BLS), ask whether its client went away.

Each question goes out with a ``call`` id (:class:`StubChannel.ask`) and the asking
thread waits, bounded, for its answers, which the channel's reader hands over. Tensors
cross in the arenas: a response's outputs and a BLS call's inputs are written into the
stub's output arena and freed once the server answered (it copies them out first); a
BLS result's outputs arrive in the input arena and are copied out by the reader, which
tells the server to free them (``release``).
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from runtimes.python_backend import pb_utils, tensors
from runtimes.python_backend.arena import Arena, ArenaFullError
from runtimes.python_backend.messages import Message
from runtimes.python_backend.stub_channel import CLOSED, StubChannel, Waiter

_SERVER_GONE = "the server went away"


class ServerCalls:
    """The server's side of a model's questions, for one stub process.

    Parameters:
        channel: the stub's channel (its reader started).
        inputs: the arena the server writes into (BLS results arrive there).
        outputs: the arena this stub writes into.
        timeout_s: the longest wait for any one answer.
    """

    def __init__(self, channel: StubChannel, inputs: Arena, outputs: Arena, timeout_s: float):
        self._channel = channel
        self._inputs = inputs
        self._outputs = outputs
        self._timeout_s = timeout_s

    @property
    def timeout_s(self) -> float:
        """The longest wait for any one answer of the server."""
        return self._timeout_s

    # ---- on the reader thread ----

    def received(self, message: Message) -> Message:
        """Copy a BLS result's tensors out of the input arena and release their blocks."""
        if message.get("kind") == "bls_result" and message.get("outputs"):
            descriptors = message["outputs"]
            try:
                message["arrays"] = [
                    (d["name"], tensors.read(self._inputs, d)) for d in descriptors
                ]
            finally:
                self._channel.send(
                    {"kind": "release", "offsets": [d["offset"] for d in descriptors]}
                )
        return message

    # ---- on model threads ----

    def is_cancelled(self, execution: int, index: int) -> bool:
        call, waiter = self._channel.ask(
            {"kind": "is_cancelled", "id": execution, "request": index}
        )
        try:
            answer = waiter.next(self._timeout_s)
        finally:
            self._channel.forget(call)
        return answer is CLOSED or bool(answer.get("value"))

    def send_response(
        self,
        request: pb_utils.InferenceRequest,
        response: pb_utils.InferenceResponse | None,
        flags: int,
    ) -> None:
        """Send a response of ``request`` and wait until the server took it."""
        outputs: list[dict[str, Any]] = []
        error = None
        try:
            if response is not None:
                failure = response.error()
                if failure is not None:
                    error = {"code": failure.code().name, "message": failure.message()}
                else:
                    requested = set(request.requested_output_names())
                    for tensor in response.output_tensors():
                        # As Triton: outputs the client did not ask for are dropped here.
                        if tensor.name() in requested:
                            outputs.append(
                                tensors.write(self._outputs, tensor.name(), tensor.as_numpy())
                            )
            execution, index = request.position()
            call, waiter = self._channel.ask(
                {
                    "kind": "response",
                    "id": execution,
                    "request": index,
                    "outputs": outputs,
                    "error": error,
                    "final": bool(flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL),
                }
            )
            try:
                answer = waiter.next(self._timeout_s)
            finally:
                self._channel.forget(call)
        except ArenaFullError as exc:
            raise pb_utils.TritonModelException(str(exc)) from None
        except TimeoutError as exc:
            raise pb_utils.TritonModelException(f"Unable to send response: {exc}") from None
        finally:
            for descriptor in outputs:
                self._outputs.free(descriptor["offset"])
        if answer is CLOSED:
            raise pb_utils.TritonModelException(f"Unable to send response: {_SERVER_GONE}")
        if answer.get("error"):
            raise pb_utils.TritonModelException(str(answer["error"]))

    def call_model(
        self, request: pb_utils.InferenceRequest, decoupled: bool
    ) -> pb_utils.InferenceResponse | pb_utils.ResponseIterator:
        """Send a BLS request; its response, or an iterator of its responses."""
        descriptors: list[dict[str, Any]] = []
        try:
            for tensor in request.inputs():
                descriptors.append(tensors.write(self._outputs, tensor.name(), tensor.as_numpy()))
        except ArenaFullError as exc:
            self._free(descriptors)
            return _error_response(str(exc))
        call, waiter = self._channel.ask(
            {
                "kind": "bls",
                "model": request.model_name(),
                "version": request.model_version(),
                "inputs": descriptors,
                "requested": request.requested_output_names(),
                "request_id": request.request_id(),
                "correlation_id": request.correlation_id(),
                "flags": request.flags(),
                "timeout": request.timeout(),
                "parameters": request.parameters(),
                "decoupled": decoupled,
            }
        )
        responses = _Responses(self, call, waiter, descriptors)
        if decoupled:
            # As in Triton, the call returns once its first response is in: an
            # ``async_exec`` then waits in its executor thread, not in the event loop
            # that iterating would block.
            first: list[pb_utils.InferenceResponse | None] = [responses.next()]

            def next_response() -> pb_utils.InferenceResponse | None:
                return first.pop() if first else responses.next()

            return pb_utils.ResponseIterator(next_response, responses.cancel)
        response = responses.next()
        while response is not None and not response.is_last:
            # A model that is not decoupled answers once; a decoupled one called without
            # decoupled=True is refused by the server before it runs.
            response = responses.next()
        return response if response is not None else _error_response(_SERVER_GONE)

    def _free(self, descriptors: list[dict[str, Any]]) -> None:
        for descriptor in descriptors:
            self._outputs.free(descriptor["offset"])

    def wait(self, waiter: Waiter) -> Message:
        return waiter.next(self._timeout_s)

    def forget(self, call: int) -> None:
        self._channel.forget(call)

    def cancel(self, call: int) -> None:
        self._channel.send({"kind": "bls_cancel", "call": call})


class _Responses:
    """The answers of one BLS call, as pb_utils responses."""

    def __init__(
        self, calls: ServerCalls, call: int, waiter: Waiter, inputs: list[dict[str, Any]]
    ) -> None:
        self._calls = calls
        self._call = call
        self._waiter = waiter
        self._inputs: list[dict[str, Any]] | None = inputs
        self._is_done = False

    def next(self) -> pb_utils.InferenceResponse | None:
        if self._is_done:
            return None
        try:
            answer = self._calls.wait(self._waiter)
        except TimeoutError as exc:
            answer = {"final": True, "error": {"code": "INTERNAL", "message": str(exc)}}
        # The server copied the inputs before it answered anything.
        if self._inputs is not None:
            self._calls._free(self._inputs)
            self._inputs = None
        if answer is CLOSED:
            answer = {"final": True, "error": {"code": "INTERNAL", "message": _SERVER_GONE}}
        if answer.get("final"):
            self._is_done = True
            self._calls.forget(self._call)
        return _response(answer)

    def cancel(self) -> None:
        if not self._is_done:
            with contextlib.suppress(OSError):
                self._calls.cancel(self._call)


def _response(answer: Message) -> pb_utils.InferenceResponse:
    error = answer.get("error")
    if error is not None:
        code = pb_utils.ErrorCode.__members__.get(
            str(error.get("code")), pb_utils.ErrorCode.INTERNAL
        )
        response = pb_utils.InferenceResponse(
            error=pb_utils.TritonError(str(error.get("message", "")), code)
        )
    else:
        arrays: list[tuple[str, np.ndarray]] = answer.get("arrays") or []
        response = pb_utils.InferenceResponse([pb_utils.Tensor(n, a) for n, a in arrays])
    response.is_last = bool(answer.get("final"))
    return response


def _error_response(message: str) -> pb_utils.InferenceResponse:
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))
