"""The server's side of BLS calls a stub's model makes.

Each call runs on a task of its own through the server's :class:`ModelCaller`; every
response it yields is written into the stub's input arena and sent back as a
``bls_result`` carrying the call's id. The stub may cancel a call; a stub that closes
or dies ends them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Final

from foundation.errors import ZeroserveError
from runtimes.errors import (
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
    UnsupportedError,
)
from runtimes.model_request import ModelCall, ModelCaller, StreamedResponse
from runtimes.python_backend import tensors
from runtimes.python_backend.arena import Arena, ArenaFullError
from runtimes.python_backend.messages import Message

_NO_CALLS: Final = "BLS is not available: this server gives its Python models no way to call models"
_CODES: Final[tuple[tuple[type[ZeroserveError], str], ...]] = (
    (InvalidArgumentError, "INVALID_ARG"),
    (NotFoundError, "NOT_FOUND"),
    (UnavailableError, "UNAVAILABLE"),
    (UnsupportedError, "UNSUPPORTED"),
    (InternalError, "INTERNAL"),
)
"""Error class -> the TritonError code a model reads in a BLS response."""


class BlsCalls:
    """The BLS calls in flight for one stub named ``name``.

    Call inputs are read from ``outputs`` (the stub's arena), results written into
    ``inputs`` (the server's); ``send`` writes a message to the stub, and ``is_open()``
    says whether it still takes messages (not dead, not closing).
    """

    def __init__(
        self,
        name: str,
        inputs: Arena,
        outputs: Arena,
        send: Callable[[Message], None],
        is_open: Callable[[], bool],
        caller: ModelCaller | None,
    ) -> None:
        self._name = name
        self._inputs = inputs
        self._outputs = outputs
        self._send = send
        self._is_open = is_open
        self._caller = caller
        self._calls: dict[int, asyncio.Task[None]] = {}

    def start(self, message: Message) -> None:
        """Run the ``bls`` message's call on a task of its own."""
        call = int(message["call"])
        inputs = {d["name"]: tensors.read(self._outputs, d) for d in message["inputs"]}
        parameters = message.get("parameters") or "{}"
        model_call = ModelCall(
            model=str(message["model"]),
            inputs=inputs,
            requested_outputs=tuple(message.get("requested") or ()),
            version=int(message.get("version", -1)),
            request_id=str(message.get("request_id") or ""),
            correlation_id=message.get("correlation_id") or 0,
            flags=int(message.get("flags") or 0),
            timeout_us=int(message.get("timeout") or 0),
            parameters=_parameters(parameters),
            is_decoupled=bool(message.get("decoupled")),
        )
        task = asyncio.get_running_loop().create_task(
            self._run(call, model_call), name=f"bls-{self._name}-{call}"
        )
        self._calls[call] = task
        task.add_done_callback(lambda _: self._calls.pop(call, None))

    def cancel(self, call: int) -> None:
        """The stub cancelled call ``call`` (its final result still goes back)."""
        task = self._calls.get(call)
        if task is not None:
            task.cancel()

    def end(self) -> None:
        """Cancel every call in flight (the stub closes or died)."""
        for task in list(self._calls.values()):
            task.cancel()
        self._calls.clear()

    async def _run(self, call: int, model_call: ModelCall) -> None:
        caller = self._caller
        if caller is None:
            self._send_result(call, StreamedResponse({}, InternalError(_NO_CALLS), True))
            return
        final = False
        try:
            async with contextlib.aclosing(caller.call(model_call)) as responses:
                async for response in responses:
                    final = response.is_final
                    self._send_result(call, response)
                    if final:
                        return
        except asyncio.CancelledError:
            if not final and self._is_open():
                text = f"BLS request to model '{model_call.model}' was cancelled"
                self._send_result(
                    call, StreamedResponse({}, InternalError(text), True), "CANCELLED"
                )
            raise
        if not final:
            self._send_result(call, StreamedResponse({}, None, True))

    def _send_result(self, call: int, response: StreamedResponse, code: str = "INTERNAL") -> None:
        if not self._is_open():
            return
        message: Message = {"kind": "bls_result", "call": call, "final": response.is_final}
        if response.error is not None:
            message["error"] = {
                "code": _error_code(response.error, code),
                "message": response.error.message,
            }
        else:
            written = []
            try:
                for name, array in response.outputs.items():
                    written.append(tensors.write(self._inputs, name, array))
            except ArenaFullError as exc:
                for descriptor in written:
                    self._inputs.free(descriptor["offset"])
                message["error"] = {"code": "INTERNAL", "message": str(exc)}
                written = []
            message["outputs"] = written
        self._send(message)


def _parameters(text: str) -> dict[str, bool | int | str]:
    try:
        parsed = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(parsed, dict):
        return {}
    return {k: v for k, v in parsed.items() if isinstance(v, bool | int | str)}


def _error_code(error: ZeroserveError, default: str) -> str:
    for cls, code in _CODES:
        if isinstance(error, cls) and (cls is not InternalError or default == "INTERNAL"):
            return code
    return default
