"""The stub's side of the channel: imports ``model.py``, calls ``TritonPythonModel`` as
Triton's stub does, and answers the server.

One ``ModelHost`` per stub process; the main thread runs it (the model's ``execute`` runs
on it too, so the model may hold the GIL as long as it likes: only this process waits).
Error texts are Triton's: a Python exception becomes ``<Type>: <message>`` followed by
``At:`` and the model's frames, innermost first, without the stub's own frames; the
backend's checks of what ``execute`` returned give Triton's bare sentences.
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
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from runtimes.python_backend import messages, pb_utils, tensors
from runtimes.python_backend.arena import Arena, ArenaFullError
from runtimes.python_backend.messages import Message

MODULE_NAME: Final = "triton_python_backend_utils"
"""The name models import pb_utils by."""
MODEL_CLASS: Final = "TritonPythonModel"
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
        self._channel = messages.Channel(sock)
        self._inputs = inputs
        self._outputs = outputs
        self._name = name
        # Model threads may log while the main thread talks to the server.
        self._send_lock = threading.Lock()
        self._model: Any = None
        self._model_path = ""
        self._model_dir = ""
        self._model_name = ""
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---- pb_utils.Host ----

    def log(self, level: str, message: str) -> None:
        self._send({"kind": "log", "level": level, "message": message})

    def is_cancelled(self, execution: int, index: int) -> bool:
        self._send({"kind": "is_cancelled", "id": execution, "requests": [index]})
        while True:
            reply = self._channel.receive()
            if reply["kind"] == "cancelled" and reply.get("id") == execution:
                return bool(reply["values"][0])

    def model_dir(self) -> str:
        return self._model_dir

    # ---- the loop ----

    def serve(self) -> int:
        """Answer the server's messages until it says finalize or goes away."""
        pb_utils.bind(self)
        sys.modules[MODULE_NAME] = pb_utils
        while True:
            try:
                message = self._channel.receive()
            except messages.ChannelClosedError:
                return 0
            # The server copied the last result's tensors out before it sent anything new.
            self._outputs.free_all()
            kind = message["kind"]
            if kind == "execute":
                self._send(self._execute(message))
            elif kind == "init":
                self._send({"kind": "init_done", "error": self._initialize(message)})
            elif kind == "auto_complete":
                self._send(self._auto_complete(message))
                return 0
            elif kind == "finalize":
                self._finalize()
                self._send({"kind": "finalize_done"})
                return 0
            else:
                self.log("ERROR", f"stub {self._name} ignored a message of kind {kind!r}")

    def _send(self, message: Message) -> None:
        with self._send_lock:
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
        try:
            model_class = self._import_model(message)
            self._model = model_class()
            initialize = getattr(self._model, "initialize", None)
            if initialize is not None:
                initialize(message["args"])
        except Exception as exc:
            return describe(exc)
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
                returned = self._run_coroutine(returned)
            responses = self._encode(requests, returned)
        except Exception as exc:
            self._outputs.free_all()
            error = (
                f"Failed to process the request(s) for model '{self._name}', message: "
                f"{describe(exc)}"
            )
            return {"kind": "result", "id": execution, "error": error}
        return {"kind": "result", "id": execution, "error": None, "responses": responses}

    def _request(self, execution: int, index: int, entry: Message) -> pb_utils.InferenceRequest:
        inputs = [
            pb_utils.Tensor(descriptor["name"], tensors.read(self._inputs, descriptor))
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

    def _run_coroutine(self, coroutine: Any) -> Any:
        # As Triton's stub: an async execute runs on an event loop of its own thread,
        # which BLS's async_exec futures will also run on.
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            threading.Thread(target=self._loop.run_forever, name="model-loop", daemon=True).start()
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def _encode(
        self, requests: Sequence[pb_utils.InferenceRequest], returned: Any
    ) -> list[Message | None]:
        if returned is None:
            raise _BackendError(
                f"Python model '{self._name}' returned None from execute; a model that is "
                "not decoupled must return one InferenceResponse per request"
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
        for response in returned:
            if response is not None and not isinstance(response, pb_utils.InferenceResponse):
                raise _BackendError(
                    "Expected an 'InferenceResponse' object in the execute function return "
                    f"list, found type '{type(response)}'."
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
                outputs.append(tensors.write(self._outputs, tensor.name(), tensor.as_numpy()))
            except ArenaFullError as exc:
                raise _BackendError(str(exc)) from None
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
