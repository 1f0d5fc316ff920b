"""The server's side of one stub: start the process, talk to it, notice when it dies.

:func:`start` launches ``python -m runtimes.python_backend.stub`` (blocking; callers run it
in a thread) with the control socket and the two arenas inherited, and waits for its
``hello``. :class:`StubProcess` then drives it from the event loop: a protocol on the
channel takes every message the stub sends (results, log lines, cancellation questions)
as its bytes arrive, without a task in between, and notices the end of the channel, which
is how a crash shows; every wait on the stub is bounded.

Besides executions, the stub asks things while its model runs, each with a ``call`` id
that the answer carries back: a response sent through a response sender (a decoupled
model's responses go to the request's sink, then the stub is told it may go on), a BLS
call (run by the server's :class:`ModelCaller` on a task of its own, each response
written into the input arena and sent back), whether a client went away.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np

from foundation.errors import ZeroserveError
from runtimes.errors import (
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
    UnsupportedError,
)
from runtimes.model_request import (
    ModelCall,
    ModelCaller,
    RequestContext,
    ResponseSink,
    StreamedResponse,
)
from runtimes.python_backend import messages, tensors
from runtimes.python_backend.arena import Arena, ArenaFullError
from runtimes.python_backend.limits import StubLimits
from runtimes.python_backend.messages import Message

logger = logging.getLogger(__name__)

STUB_MODULE: Final = "runtimes.python_backend.stub"
_SOURCE_ROOT: Final = str(Path(__file__).resolve().parents[2])
"""The folder holding the ``runtimes`` package, put on the stub's PYTHONPATH so that an
execution environment without zeroserve installed still finds the stub."""
_NO_CALLS: Final = "BLS is not available: this server gives its Python models no way to call models"
_CODES: Final[tuple[tuple[type[ZeroserveError], str], ...]] = (
    (InvalidArgumentError, "INVALID_ARG"),
    (NotFoundError, "NOT_FOUND"),
    (UnavailableError, "UNAVAILABLE"),
    (UnsupportedError, "UNSUPPORTED"),
    (InternalError, "INTERNAL"),
)
"""Error class -> the TritonError code a model reads in a BLS response."""
_LOG_LEVELS: Final = {
    "INFO": logging.INFO,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
    "VERBOSE": logging.DEBUG,
}


@dataclass(frozen=True)
class StubCommand:
    """The interpreter a stub runs on and the environment variables it gets."""

    python: str = sys.executable
    env: Mapping[str, str] | None = None
    """The whole environment (an execution environment's); None: the server's own."""


class StubError(Exception):
    """A stub could not be started or stopped answering; the message says which."""


@dataclass
class StartedStub:
    """A stub that said hello: its process, the server's end of the channel, the arenas."""

    process: subprocess.Popen[bytes]
    sock: socket.socket
    inputs: Arena
    outputs: Arena
    name: str

    def kill(self) -> None:
        """Stop the process now, reap it, and close the channel and the arenas."""
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5.0)
        self.close_resources()

    def close_resources(self) -> None:
        self.sock.close()
        self.inputs.close()
        self.outputs.close()


def start(name: str, command: StubCommand, limits: StubLimits) -> StartedStub:
    """Start a stub named ``name`` and wait (bounded) for its hello (blocking).

    Raises StubError when it cannot start or says nothing in ``limits.stub_timeout_s``.
    """
    server_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    inputs = outputs = None
    try:
        inputs = Arena.create(
            f"zeroserve-{name}-in",
            size_bytes=limits.shm_initial_bytes,
            limit_bytes=limits.shm_limit_bytes,
        )
        outputs = Arena.create(
            f"zeroserve-{name}-out", size_bytes=limits.shm_initial_bytes, limit_bytes=0
        )
        env = dict(command.env if command.env is not None else os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_SOURCE_ROOT, env.get("PYTHONPATH")]))
        # A model's print() should reach the log as it happens, not when a buffer fills.
        env["PYTHONUNBUFFERED"] = "1"
        args = [
            command.python,
            "-m",
            STUB_MODULE,
            f"--socket-fd={child_sock.fileno()}",
            f"--input-fd={inputs.fd}",
            f"--output-fd={outputs.fd}",
            f"--output-limit-bytes={limits.shm_limit_bytes}",
            f"--parent-pid={os.getpid()}",
            f"--name={name}",
        ]
        process = subprocess.Popen(
            args,
            pass_fds=(child_sock.fileno(), inputs.fd, outputs.fd),
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except BaseException as exc:
        for arena in (inputs, outputs):
            if arena is not None:
                arena.close()
        server_sock.close()
        if isinstance(exc, OSError):
            raise StubError(f"cannot start {command.python}: {exc}") from exc
        raise
    finally:
        child_sock.close()
    started = StartedStub(process, server_sock, inputs, outputs, name)
    server_sock.settimeout(limits.stub_timeout_s)
    try:
        hello = messages.receive(server_sock)
    except (messages.ChannelClosedError, OSError, ValueError) as exc:
        started.kill()
        code = process.returncode
        raise StubError(
            f"Python stub '{name}' ({command.python}) exited with code {code} before it "
            "started; its error is in the server's log"
            if code is not None
            else f"Python stub '{name}' did not start within {limits.stub_timeout_s} s: {exc}"
        ) from exc
    if hello.get("kind") != "hello":
        started.kill()
        raise StubError(f"Python stub '{name}' sent {hello.get('kind')!r} instead of hello")
    return started


class StubDeadError(Exception):
    """The stub's process ended or was stopped; ``str()`` is the text clients get."""


ResponseError = Callable[[Message], ZeroserveError]
"""A response's ``{code, message}`` as the error its client gets."""


@dataclass
class _Request:
    """A request the stub holds: until its execution's result, or for a decoupled one
    until its final response."""

    context: RequestContext
    sink: ResponseSink | None
    single: Message | None = None
    """The one response a model that is not decoupled sent through its sender."""


class StubProcess:
    """A started stub driven from the event loop.

    ``on_death(reason)`` is called once if the process ends (or is stopped) other than
    through :meth:`close`. One :meth:`execute` at a time; the caller (one model instance)
    guarantees it.
    """

    def __init__(
        self,
        started: StartedStub,
        limits: StubLimits,
        *,
        on_death: Callable[[str], None] | None = None,
        caller: ModelCaller | None = None,
        response_error: ResponseError | None = None,
    ) -> None:
        self.name = started.name
        self._started = started
        self._limits = limits
        self._on_death = on_death
        self._caller = caller
        self._response_error = response_error
        self._ids = itertools.count(1)
        self._pending: dict[int | str, asyncio.Future[Message]] = {}
        self._requests: dict[tuple[int, int], _Request] = {}
        self._calls: dict[int, asyncio.Task[None]] = {}
        self._sizes: dict[int, int] = {}
        self._held: dict[int, list[int]] = {}
        self._dead_reason: str | None = None
        self._closing = False
        self._transport: asyncio.Transport | None = None

    @property
    def pid(self) -> int:
        return self._started.process.pid

    @property
    def is_alive(self) -> bool:
        return self._dead_reason is None and self._started.process.poll() is None

    async def open(self) -> None:
        """Connect the channel to the event loop and start reading."""
        sock = self._started.sock
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        self._transport, _ = await loop.create_unix_connection(
            lambda: _ChannelProtocol(self), sock=sock
        )

    async def call(self, message: Message, answer: str, timeout_s: float) -> Message:
        """Send a control message and wait (bounded) for its answer of kind ``answer``.

        Raises StubDeadError if the stub dies first, TimeoutError past ``timeout_s``.
        """
        future = self._expect(answer)
        self._send(message)
        try:
            async with asyncio.timeout(timeout_s):
                return await future
        finally:
            self._pending.pop(answer, None)

    async def execute(
        self,
        requests: Sequence[Message],
        arrays: Sequence[Mapping[str, np.ndarray]],
        contexts: Sequence[RequestContext],
    ) -> Message:
        """Run one execution: ``requests`` are the wire entries without their inputs,
        ``arrays`` each request's input tensors, ``contexts`` their contexts (a request
        with a response sink gets its responses there, also after the execution).
        Returns the ``result`` message with every output tensor already copied out
        (``arrays`` per response; a response sent through a sender stands in for a
        missing one).

        Raises StubDeadError when the stub is dead or dies meanwhile (and stops a stub that
        overruns ``execute_timeout_s``), ``arena.ArenaFullError`` when the inputs do not fit.
        """
        if self._dead_reason is not None:
            raise StubDeadError(self._dead_reason)
        execution = next(self._ids)
        held: list[int] = []
        self._held[execution] = held
        try:
            entries = []
            for entry, inputs in zip(requests, arrays, strict=True):
                descriptors = []
                for name, array in inputs.items():
                    descriptor = tensors.write(self._started.inputs, name, array)
                    held.append(descriptor["offset"])
                    descriptors.append(descriptor)
                entries.append({**entry, "inputs": descriptors})
        except BaseException:
            self._release(execution)
            raise
        future = self._expect(execution)
        for index, context in enumerate(contexts):
            self._requests[execution, index] = _Request(context, context.responses)
        self._sizes[execution] = len(contexts)
        self._send({"kind": "execute", "id": execution, "requests": entries})
        failed = True
        try:
            async with asyncio.timeout(self._limits.execute_timeout_s):
                reply = await future
            failed = reply.get("error") is not None
            return reply
        except TimeoutError:
            reason = (
                f"Stub process '{self.name}' did not finish execute within "
                f"{self._limits.execute_timeout_s} s; it was stopped"
            )
            self._die(reason)
            self._started.process.kill()
            raise StubDeadError(reason) from None
        finally:
            self._pending.pop(execution, None)
            self._end_execution(execution, failed=failed)

    async def close(self, message: Message | None = None, answer: str = "") -> None:
        """End the stub: send ``message`` (``finalize``) and wait for ``answer`` if it is
        alive, then wait for the exit (bounded) or kill it, and free the channel and the
        arenas. Never raises for a stub that misbehaves; idempotent."""
        if self._closing:
            return
        self._closing = True
        timeout_s = self._limits.stub_timeout_s
        if message is not None and self._dead_reason is None:
            try:
                await self.call(message, answer, timeout_s)
            except (StubDeadError, TimeoutError, OSError) as exc:
                logger.warning("stub %s did not finalize cleanly: %r", self.name, exc)
        self._end_calls()
        if self._transport is not None:
            self._transport.close()
        process = self._started.process
        try:
            await asyncio.to_thread(process.wait, timeout_s)
        except subprocess.TimeoutExpired:
            logger.warning("stub %s did not exit within %s s; killing it", self.name, timeout_s)
        await asyncio.to_thread(self._started.kill)

    # ---- internals ----

    def _expect(self, key: int | str) -> asyncio.Future[Message]:
        if self._dead_reason is not None:
            raise StubDeadError(self._dead_reason)
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        return future

    def _send(self, message: Message) -> None:
        assert self._transport is not None, "open() first"
        self._transport.write(messages.encode(message))

    def _release(self, execution: int) -> None:
        for offset in self._held.pop(execution, ()):
            self._started.inputs.free(offset)

    def _received(self, frames: messages.FrameBuffer) -> None:
        """The protocol got bytes: handle every message they complete."""
        try:
            for message in frames.messages():
                self._dispatch(message)
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            logger.error("stub %s sent a malformed message: %r; stopping it", self.name, exc)
            self._started.process.kill()
            self._die(f"Stub process '{self.name}' is not healthy.")

    def _channel_lost(self) -> None:
        if not self._closing:
            logger.error(
                "the Python stub %s (pid %d) ended unexpectedly",
                self.name,
                self.pid,
                extra={"stub": self.name},
            )
        self._die(f"Stub process '{self.name}' is not healthy.")

    def _dispatch(self, message: Message) -> None:
        kind = message["kind"]
        if kind == "result":
            execution = int(message["id"])
            future = self._pending.get(execution)
            if future is not None and not future.done():
                try:
                    future.set_result(self._copy_outputs(execution, message))
                except (ValueError, KeyError, TypeError) as exc:
                    future.set_exception(StubDeadError(f"malformed result from the stub: {exc}"))
            self._release(execution)
        elif kind == "response":
            self._response(message)
        elif kind == "log":
            level = _LOG_LEVELS.get(str(message.get("level")), logging.INFO)
            logger.log(level, "%s: %s", self.name, message.get("message"))
        elif kind == "is_cancelled":
            request = self._requests.get((int(message["id"]), int(message["request"])))
            value = True if request is None else request.context.is_cancelled()
            self._send({"kind": "cancelled", "call": message["call"], "value": value})
        elif kind == "bls":
            self._start_call(message)
        elif kind == "bls_cancel":
            task = self._calls.get(int(message["call"]))
            if task is not None:
                task.cancel()
        elif kind == "release":
            for offset in message["offsets"]:
                self._started.inputs.free(int(offset))
        else:
            future = self._pending.get(kind)
            if future is not None and not future.done():
                future.set_result(message)
            else:
                logger.warning("stub %s sent an unexpected %r", self.name, kind)

    def _copy_outputs(self, execution: int, message: Message) -> Message:
        responses = message.get("responses")
        if message.get("error") is None:
            count = len(responses) if responses is not None else 0
            size = max(count, self._sizes.get(execution, 0))
            singles = [
                self._requests[execution, i].single if (execution, i) in self._requests else None
                for i in range(size)
            ]
            if responses is None:
                responses = [None] * len(singles)
            message["responses"] = responses = [
                r if r is not None else singles[i] for i, r in enumerate(responses)
            ]
        for response in responses or ():
            if response is not None and "outputs" in response and "arrays" not in response:
                response["arrays"] = {
                    d["name"]: tensors.read(self._started.outputs, d) for d in response["outputs"]
                }
        return message

    def _end_execution(self, execution: int, *, failed: bool) -> None:
        """The execution is over: forget its requests but the decoupled ones it left
        open (their responses may still come), unless it failed."""
        for index in range(self._sizes.pop(execution, 0)):
            request = self._requests.get((execution, index))
            if request is None:
                continue
            if request.sink is None or failed or self._dead_reason is not None:
                del self._requests[execution, index]

    def _response(self, message: Message) -> None:
        """A response sent through a response sender: copied out, handed on, acknowledged."""
        key = (int(message["id"]), int(message["request"]))
        arrays = {d["name"]: tensors.read(self._started.outputs, d) for d in message["outputs"]}
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

    def _acknowledge(self, answer: Message) -> None:
        if self._dead_reason is None and not self._closing:
            self._send(answer)

    def _error_of(self, error: Message) -> ZeroserveError:
        if self._response_error is not None:
            return self._response_error(error)
        return InternalError(str(error.get("message", "")))

    def _start_call(self, message: Message) -> None:
        call = int(message["call"])
        inputs = {d["name"]: tensors.read(self._started.outputs, d) for d in message["inputs"]}
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
            self._run_call(call, model_call), name=f"bls-{self.name}-{call}"
        )
        self._calls[call] = task
        task.add_done_callback(lambda _: self._calls.pop(call, None))

    async def _run_call(self, call: int, model_call: ModelCall) -> None:
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
            if not final and self._dead_reason is None and not self._closing:
                text = f"BLS request to model '{model_call.model}' was cancelled"
                self._send_result(
                    call, StreamedResponse({}, InternalError(text), True), "CANCELLED"
                )
            raise
        if not final:
            self._send_result(call, StreamedResponse({}, None, True))

    def _send_result(self, call: int, response: StreamedResponse, code: str = "INTERNAL") -> None:
        if self._dead_reason is not None or self._closing:
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
                    written.append(tensors.write(self._started.inputs, name, array))
            except ArenaFullError as exc:
                for descriptor in written:
                    self._started.inputs.free(descriptor["offset"])
                message["error"] = {"code": "INTERNAL", "message": str(exc)}
                written = []
            message["outputs"] = written
        self._send(message)

    def _end_calls(self) -> None:
        for task in list(self._calls.values()):
            task.cancel()
        self._calls.clear()

    def _die(self, reason: str) -> None:
        if self._dead_reason is not None:
            return
        self._dead_reason = reason
        for future in self._pending.values():
            if not future.done():
                future.set_exception(StubDeadError(reason))
        self._pending.clear()
        self._end_calls()
        requests, self._requests = self._requests, {}
        for request in requests.values():
            if request.sink is not None:
                request.sink(StreamedResponse({}, InternalError(reason), True), _nothing)
        if not self._closing and self._on_death is not None:
            self._on_death(reason)


def _nothing() -> None:
    return None


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


class _ChannelProtocol(asyncio.BufferedProtocol):
    """The server's end of a stub's channel: frames in, to its StubProcess.

    Buffered, so that each read lands in one reused buffer: a plain Protocol has asyncio
    allocate a fresh 256 KiB bytes object per read, which costs more than the read.
    """

    def __init__(self, stub: StubProcess) -> None:
        self._stub = stub
        self._frames = messages.FrameBuffer()
        self._buffer = bytearray(1 << 16)

    def get_buffer(self, sizehint: int) -> memoryview:
        return memoryview(self._buffer)

    def buffer_updated(self, nbytes: int) -> None:
        self._frames.feed(self._buffer[:nbytes])
        self._stub._received(self._frames)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stub._channel_lost()
