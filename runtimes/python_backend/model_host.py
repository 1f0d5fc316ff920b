"""The stub's side of the channel: imports ``model.py``, calls ``TritonPythonModel`` as
Triton's stub does, and answers the server.

One ``ModelHost`` per stub process; the main thread runs it (the model's ``execute`` runs
on it too, so the model may hold the GIL as long as it likes: only this process waits).
Error texts are Triton's: a Python exception becomes ``<Type>: <message>`` followed by
``At:`` and the model's frames, innermost first, without the stub's own frames; the
backend's checks of what ``execute`` returned give Triton's bare sentences.

Whichever thread waits reads the channel (:mod:`.stub_channel`), so that a model's
questions to the server (response senders, BLS calls, ``is_cancelled``) are answered
from any thread while the main thread runs ``execute``, and the idle main thread reads
its next ``execute`` itself. A decoupled model's ``async def
execute`` runs in the background, as in Triton: the instance takes its next requests
while the coroutine awaits, so that a model may call itself through BLS.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from runtimes.python_backend import messages, pb_utils, tensors
from runtimes.python_backend.arena import Arena, ArenaFullError
from runtimes.python_backend.messages import Message
from runtimes.python_backend.native_threads import NativeThreads, is_time_to_look
from runtimes.python_backend.pb_response import Tensor, datatype_of
from runtimes.python_backend.stub_calls import ServerCalls
from runtimes.python_backend.stub_channel import CLOSED, StubChannel

MODULE_NAME: Final = "triton_python_backend_utils"
"""The name models import pb_utils by."""
MODEL_CLASS: Final = "TritonPythonModel"
DEFAULT_CALL_TIMEOUT_S: Final = 600.0
"""The longest a model waits for one answer of the server, unless ``init`` says."""
_PACKAGE_DIR: Final = str(Path(__file__).resolve().parent)


class _BackendError(Exception):
    """A check of the backend failed; Triton reports its bare message (no type, no frames)."""


def describe(error: BaseException) -> str:
    """Triton's text for an exception raised by model code: type, message, and the
    model's frames innermost first (frames of the stub and of pb_utils left out, as the
    C++ ones are in Triton)."""
    if isinstance(error, _BackendError):
        return str(error)
    text = f"{type(error).__name__}: {error}"
    frames = [
        frame
        for frame in traceback.extract_tb(error.__traceback__)
        if not frame.filename.startswith(_PACKAGE_DIR)
    ]
    if frames:
        text += "\n\nAt:\n" + "".join(
            f"  {frame.filename}({frame.lineno}): {frame.name}\n" for frame in reversed(frames)
        )
    return text


class ModelHost:
    """Runs one model instance for the server at the other end of ``sock``.

    Parameters:
        sock: the control channel (blocking).
        inputs: the arena the server writes request tensors into.
        outputs: the arena this side writes response tensors into.
        name: the instance's name (``<model>_0_0``), which Triton's error texts carry.
    """

    def __init__(self, sock: socket.socket, inputs: Arena, outputs: Arena, name: str) -> None:
        self._channel = StubChannel(messages.Channel(sock), self._received)
        self._inputs = inputs
        self._outputs = outputs
        self._name = name
        self._calls = ServerCalls(self._channel, inputs, outputs, DEFAULT_CALL_TIMEOUT_S)
        self._model: Any = None
        self._model_path = ""
        self._model_dir = ""
        self._model_name = ""
        self._is_decoupled = False
        # BLS is offered between initialize and finalize, as in Triton.
        self._can_call = False
        self._loop: asyncio.AbstractEventLoop | None = None
        # The blocks of the last result's outputs: the server copied them out before it
        # sent the main thread anything new.
        self._result_blocks: list[int] = []
        self._native_threads = NativeThreads(enabled=False)
        self._executions = 0
        self._deleted: deque[int] = deque()

    # ---- pb_utils.Host ----

    def log(self, level: str, message: str) -> None:
        self._channel.send({"kind": "log", "level": level, "message": message})

    def is_cancelled(self, execution: int, index: int) -> bool:
        return self._calls.is_cancelled(execution, index)

    def model_dir(self) -> str:
        return self._model_dir

    @property
    def is_decoupled(self) -> bool:
        return self._is_decoupled

    def send_response(
        self,
        request: pb_utils.InferenceRequest,
        response: pb_utils.InferenceResponse | None,
        flags: int,
    ) -> None:
        self._calls.send_response(request, response, flags)

    def call_model(
        self, request: pb_utils.InferenceRequest, decoupled: bool
    ) -> pb_utils.InferenceResponse | pb_utils.ResponseIterator:
        if not self._can_call:
            raise pb_utils.TritonModelException(
                "BLS is only supported during the 'execute' function."
            )
        return self._calls.call_model(request, decoupled)

    def metric_call(self, operation: str, arguments: dict[str, Any]) -> float:
        self._send_deleted()
        call, waiter = self._channel.ask({"kind": "metric", "op": operation, "args": arguments})
        try:
            answer = waiter.next(self._calls.timeout_s)
        finally:
            self._channel.forget(call)
        if answer is CLOSED:
            raise pb_utils.TritonModelException("the server went away")
        error = answer.get("error")
        if error is not None:
            raise pb_utils.TritonModelException(
                f"Failed to process the request for model '{self._name}', message: {error}"
            )
        return float(answer["value"])

    def metric_delete(self, handle: int) -> None:
        # Runs from __del__, maybe inside the channel's send lock on this very thread:
        # a deque's append takes no lock; the handles go out with the next message.
        self._deleted.append(handle)

    def _send_deleted(self) -> None:
        if not self._deleted:
            return
        handles = []
        with contextlib.suppress(IndexError):
            while True:
                handles.append(self._deleted.popleft())
        if handles:
            # No answer awaited: a deletion cannot fail in a way the model could act on.
            self._channel.send({"kind": "metric", "op": "delete", "args": {"handles": handles}})

    def _received(self, message: Message) -> Message:
        return self._calls.received(message)

    # ---- the loop ----

    def serve(self) -> int:
        """Answer the server's messages until it says finalize or goes away."""
        pb_utils.bind(self)
        sys.modules[MODULE_NAME] = pb_utils
        while True:
            message = self._channel.next_work()
            for offset in self._result_blocks:
                self._outputs.free(offset)
            self._result_blocks.clear()
            kind = message["kind"]
            if kind == "closed":
                return 0
            if kind == "execute":
                self._send(self._execute(message))
                self._executions += 1
                if is_time_to_look(self._executions):
                    self._native_threads.look()
            elif kind == "init":
                self._send({"kind": "init_done", "error": self._initialize(message)})
            elif kind == "auto_complete":
                self._send(self._auto_complete(message))
                return 0
            elif kind == "finalize":
                self._finalize()
                self._send({"kind": "finalize_done"})
                return 0

    def _send(self, message: Message) -> None:
        self._send_deleted()
        self._channel.send(message)

    # ---- model lifecycle ----

    def _import_model(self, message: Message) -> Any:
        path = Path(message["path"])
        version_dir = path.parent
        self._model_path = str(path)
        self._model_dir = str(version_dir)
        self._model_name = message.get("model", "")
        # As Triton's stub: the version folder and the model folder go on sys.path, and
        # the file is imported as the module "<version>.<file name>".
        sys.path.append(str(version_dir))
        sys.path.append(str(version_dir.parent))
        module_name = f"{message['version']}.{path.stem}"
        __import__(module_name)
        return getattr(sys.modules[module_name], MODEL_CLASS)

    def _initialize(self, message: Message) -> str | None:
        self._is_decoupled = bool(message.get("decoupled"))
        self._native_threads = NativeThreads(enabled=message.get("native_threads") == "idle")
        timeout_s = message.get("call_timeout_s")
        if timeout_s:
            self._calls = ServerCalls(self._channel, self._inputs, self._outputs, timeout_s)
        try:
            model_class = self._import_model(message)
            self._model = model_class()
            initialize = getattr(self._model, "initialize", None)
            if initialize is not None:
                initialize(message["args"])
        except Exception as exc:
            return describe(exc)
        self._native_threads.look()
        self._can_call = True
        return None

    def _auto_complete(self, message: Message) -> Message:
        try:
            model_class = self._import_model(message)
            config = pb_utils.ModelConfig(message["config"])
            complete = getattr(model_class, "auto_complete_config", None)
            if complete is not None:
                config = complete(config)
            if not isinstance(config, pb_utils.ModelConfig):
                raise _BackendError(
                    f"auto_complete_config function in model '{self._name}' must return a "
                    "valid pb.ModelConfig object."
                )
            text = json.dumps(config.as_dict())
        except Exception as exc:
            return {"kind": "auto_complete_done", "error": describe(exc)}
        return {"kind": "auto_complete_done", "config": text}

    def _finalize(self) -> None:
        self._can_call = False
        finalize = getattr(self._model, "finalize", None)
        if finalize is None:
            return
        try:
            finalize()
        except Exception as exc:
            self.log("INFO", describe(exc))
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)

    # ---- execute ----

    def _execute(self, message: Message) -> Message:
        execution = int(message["id"])
        requests: list[pb_utils.InferenceRequest] = []
        try:
            requests = [
                self._request(execution, index, entry)
                for index, entry in enumerate(message["requests"])
            ]
            if not hasattr(self._model, "execute"):
                raise _BackendError(
                    f"Python model {self._model_path} does not implement `execute` method."
                )
            returned = self._model.execute(requests)
            if asyncio.iscoroutine(returned):
                if self._is_decoupled:
                    self._run_in_background(returned, requests)
                    returned = None
                else:
                    returned = self._run_coroutine(returned)
            responses = self._encode(requests, returned)
        except Exception as exc:
            for offset in self._result_blocks:
                self._outputs.free(offset)
            self._result_blocks.clear()
            # The server fails every request of the execution; their senders are done.
            for request in requests:
                request.get_response_sender().close()
            error = (
                f"Failed to process the request(s) for model '{self._name}', message: "
                f"{describe(exc)}"
            )
            return {"kind": "result", "id": execution, "error": error}
        return {"kind": "result", "id": execution, "error": None, "responses": responses}

    def _request(self, execution: int, index: int, entry: Message) -> pb_utils.InferenceRequest:
        inputs = [
            Tensor.received(
                descriptor["name"], tensors.read(self._inputs, descriptor), descriptor["datatype"]
            )
            for descriptor in entry["inputs"]
        ]
        return pb_utils.InferenceRequest.received(
            execution=execution,
            index=index,
            model_name=self._model_name,
            request_id=entry["id"],
            correlation_id=entry["correlation_id"],
            parameters=entry["parameters"],
            requested_output_names=entry["requested"],
            flags=entry["flags"],
            inputs=inputs,
        )

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        # As Triton's stub: an async execute runs on an event loop of its own thread,
        # which BLS's async_exec futures also run on.
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            threading.Thread(target=self._loop.run_forever, name="model-loop", daemon=True).start()
        return self._loop

    def _run_coroutine(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._event_loop()).result()

    def _run_in_background(
        self, coroutine: Any, requests: Sequence[pb_utils.InferenceRequest]
    ) -> None:
        future = asyncio.run_coroutine_threadsafe(coroutine, self._event_loop())

        def done(finished: Any) -> None:
            error = finished.exception()
            if error is None:
                return
            text = (
                f"Failed to process the request(s) for model '{self._name}', message: "
                f"{describe(error)}"
            )
            self.log("ERROR", text)
            # Triton leaves such requests waiting for ever; here each that is still open
            # ends with the error, so that no client waits on a coroutine that is gone.
            for request in requests:
                sender = request.get_response_sender()
                failed = pb_utils.InferenceResponse(error=pb_utils.TritonError(text))
                with contextlib.suppress(pb_utils.TritonModelException):
                    sender.send(failed, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

        future.add_done_callback(done)

    def _encode(
        self, requests: Sequence[pb_utils.InferenceRequest], returned: Any
    ) -> list[Message | None] | None:
        if returned is None:
            # Every answer went through the response senders (or goes, if decoupled).
            return None
        if self._is_decoupled:
            raise _BackendError(
                f"Python model '{self._name}' is using the decoupled mode and the execute "
                "function must return None."
            )
        if not isinstance(returned, list):
            raise _BackendError(
                f"Expected a list in the execute return, found type '{type(returned)}'."
            )
        if len(returned) != len(requests):
            raise _BackendError(
                "Number of InferenceResponse objects do not match the number of "
                f"InferenceRequest objects. InferenceRequest(s) size is:{len(requests)}, and "
                f"InferenceResponse(s) size is:{len(returned)}\n"
            )
        for request, response in zip(requests, returned, strict=True):
            if response is None:
                continue
            if not isinstance(response, pb_utils.InferenceResponse):
                raise _BackendError(
                    "Expected an 'InferenceResponse' object in the execute function return "
                    f"list, found type '{type(response)}'."
                )
            request.get_response_sender().count(
                response, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL, is_decoupled=False
            )
        encoded: list[Message | None] = []
        for request, response in zip(requests, returned, strict=True):
            encoded.append(self._encode_response(request, response))
        return encoded

    def _encode_response(
        self, request: pb_utils.InferenceRequest, response: pb_utils.InferenceResponse | None
    ) -> Message | None:
        if response is None:
            return None
        error = response.error()
        if error is not None:
            return {"error": {"code": error.code().name, "message": error.message()}}
        requested = set(request.requested_output_names())
        outputs = []
        for tensor in response.output_tensors():
            # As Triton: outputs the client did not ask for are dropped here.
            if tensor.name() not in requested:
                continue
            try:
                descriptor = tensors.write(
                    self._outputs, tensor.name(), tensor.as_numpy(), datatype_of(tensor)
                )
            except ArenaFullError as exc:
                raise _BackendError(str(exc)) from None
            self._result_blocks.append(descriptor["offset"])
            outputs.append(descriptor)
        return {"outputs": outputs}


def watch_parent(parent_pid: int, interval_s: float = 1.0) -> None:
    """Exit the process once the server that started it is gone (it is then reparented),
    even while the model holds the main thread."""

    def watch() -> None:
        while True:
            time.sleep(interval_s)
            if os.getppid() != parent_pid:
                with contextlib.suppress(Exception):
                    sys.stderr.write("zeroserve Python stub: the server is gone; exiting\n")
                os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
