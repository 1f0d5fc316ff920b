"""The server's side of one stub: start the process, talk to it, notice when it dies.

:func:`start` launches ``python -m runtimes.python_backend.stub`` (blocking; callers run it
in a thread) with the control socket and the two arenas inherited, and waits for its
``hello``. :class:`StubProcess` then drives it from the event loop: a protocol on the
channel takes every message the stub sends (results, log lines, cancellation questions)
as its bytes arrive, without a task in between, and notices the end of the channel, which
is how a crash shows; every wait on the stub is bounded.

Besides executions, the stub asks things while its model runs, each with a ``call`` id
that the answer carries back: a response sent through a response sender (handled by
:mod:`.responses`), a BLS call (run by :mod:`.bls_server`), whether a client went away.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
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

from runtimes.custom_metrics import CustomMetrics, MetricError, run_operation
from runtimes.model_request import (
    ModelCaller,
    RequestContext,
)
from runtimes.python_backend import messages, tensors
from runtimes.python_backend.arena import Arena
from runtimes.python_backend.bls_server import BlsCalls
from runtimes.python_backend.limits import StubLimits
from runtimes.python_backend.messages import Message
from runtimes.python_backend.responses import OpenRequests, ResponseError

logger = logging.getLogger(__name__)

STUB_MODULE: Final = "runtimes.python_backend.stub"
_SOURCE_ROOT: Final = str(Path(__file__).resolve().parents[2])
"""The folder holding the ``runtimes`` package, put on the stub's PYTHONPATH so that an
execution environment without zeroserve installed still finds the stub."""
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
        metrics: CustomMetrics | None = None,
    ) -> None:
        self.name = started.name
        self._metrics = metrics
        # What the model's metric objects created, dropped when the stub ends (as
        # Triton's families go with their stub).
        self._metrics_owner = metrics.new_owner() if metrics is not None else 0
        self._started = started
        self._limits = limits
        self._on_death = on_death
        self._ids = itertools.count(1)
        self._pending: dict[int | str, asyncio.Future[Message]] = {}
        self._requests = OpenRequests(started.outputs, self._send, self._is_open, response_error)
        self._calls = BlsCalls(
            started.name, started.inputs, started.outputs, self._send, self._is_open, caller
        )
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
        self._requests.begin(execution, contexts)
        self._send({"kind": "execute", "id": execution, "requests": entries})
        # A timer handle rather than asyncio.timeout: the same bound for a third of the cost
        # on every execution (the context manager reschedules and tracks its task).
        overrun = asyncio.get_running_loop().call_later(
            self._limits.execute_timeout_s, self._overran, future
        )
        failed = True
        try:
            reply = await future
            failed = reply.get("error") is not None
            return reply
        finally:
            overrun.cancel()
            self._pending.pop(execution, None)
            self._requests.end(execution, failed=failed or self._dead_reason is not None)

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
        self._calls.end()
        self._drop_metrics()
        if self._transport is not None:
            self._transport.close()
        process = self._started.process
        try:
            await asyncio.to_thread(process.wait, timeout_s)
        except subprocess.TimeoutExpired:
            logger.warning("stub %s did not exit within %s s; killing it", self.name, timeout_s)
        await asyncio.to_thread(self._started.kill)

    # ---- internals ----

    def _overran(self, future: asyncio.Future[Message]) -> None:
        """An execution ran past ``execute_timeout_s``: stop the stub, failing it."""
        if future.done():
            return
        reason = (
            f"Stub process '{self.name}' did not finish execute within "
            f"{self._limits.execute_timeout_s} s; it was stopped"
        )
        self._die(reason)
        self._started.process.kill()

    def _is_open(self) -> bool:
        """The stub still takes messages: not dead, not closing."""
        return self._dead_reason is None and not self._closing

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
            self._requests.respond(message)
        elif kind == "log":
            level = _LOG_LEVELS.get(str(message.get("level")), logging.INFO)
            logger.log(level, "%s: %s", self.name, message.get("message"))
        elif kind == "is_cancelled":
            value = self._requests.is_cancelled(int(message["id"]), int(message["request"]))
            self._send({"kind": "cancelled", "call": message["call"], "value": value})
        elif kind == "metric":
            self._metric(message)
        elif kind == "bls":
            self._calls.start(message)
        elif kind == "bls_cancel":
            self._calls.cancel(int(message["call"]))
        elif kind == "release":
            for offset in message["offsets"]:
                self._started.inputs.free(int(offset))
        else:
            future = self._pending.get(kind)
            if future is not None and not future.done():
                future.set_result(message)
            else:
                logger.warning("stub %s sent an unexpected %r", self.name, kind)

    def _metric(self, message: Message) -> None:
        error: str | None = None
        value = 0.0
        try:
            if self._metrics is None:
                raise MetricError("custom metrics are not offered by this server")
            value = run_operation(
                self._metrics, self._metrics_owner, str(message["op"]), message.get("args") or {}
            )
        except MetricError as exc:
            error = exc.message
        call = message.get("call")
        if call is not None:
            self._send({"kind": "metric_done", "call": call, "value": value, "error": error})

    def _drop_metrics(self) -> None:
        if self._metrics is not None:
            self._metrics.drop_owner(self._metrics_owner)

    def _copy_outputs(self, execution: int, message: Message) -> Message:
        responses = message.get("responses")
        if message.get("error") is None:
            message["responses"] = responses = self._requests.fill_in(execution, responses)
        for response in responses or ():
            if response is not None and "outputs" in response and "arrays" not in response:
                response["arrays"] = {
                    d["name"]: tensors.read(self._started.outputs, d) for d in response["outputs"]
                }
        return message

    def _die(self, reason: str) -> None:
        if self._dead_reason is not None:
            return
        self._dead_reason = reason
        self._drop_metrics()
        for future in self._pending.values():
            if not future.done():
                future.set_exception(StubDeadError(reason))
        self._pending.clear()
        self._calls.end()
        self._requests.fail_all(reason)
        if not self._closing and self._on_death is not None:
            self._on_death(reason)


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
