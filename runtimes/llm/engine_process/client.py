"""The server's end of an engine process: start it, load a model, send requests, receive
tokens.

With the engine in the server's process, its generation thread and the HTTP streaming of its
tokens share one interpreter lock, and the worker never uses more than one core: on a small
model the engine ran at 0.73 of its speed alone. vLLM runs its engine core in a separate
process for the same reason; so do we. The server keeps the tokenizer (encoding, chat
templates, detokenization and stop strings stay where the text is); only token ids cross,
as the typed messages of :mod:`runtimes.llm.engine_process.messages`. The other end is
:mod:`runtimes.llm.engine_process.core`; it exits when this end closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import queue
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Final

from runtimes.llm.engine_process.messages import (
    Add,
    Batch,
    Call,
    CallName,
    Cancel,
    Fatal,
    FromEngine,
    LoadCounts,
    LoadFailed,
    LoadModel,
    Ready,
    Reply,
    Stop,
    ToEngine,
    Tokens,
)
from runtimes.llm.hf_engine import EngineInfo, TokenUpdate
from runtimes.llm.options import SpareEngineProcesses

logger = logging.getLogger(__name__)

STOP_TIMEOUT_S: Final = 60.0
"""How long a stopping engine process may take to free its engine and exit."""

_ENGINE_MODULE: Final = "runtimes.llm.engine_process"
"""What ``python -m`` runs in an engine process (its ``__main__`` runs the core)."""


class EngineProcessError(Exception):
    """The engine process could not start, refused the load, or failed a call."""


class EngineProcess:
    """The server's end of one engine process. Every method but :meth:`close` runs on the
    event loop that :meth:`start` ran on.

    ``on_updates`` receives each batch of token updates; ``on_exit`` is called once if the
    process dies or reports its engine dead (not after :meth:`close`).
    """

    def __init__(
        self,
        process: subprocess.Popen[Any],
        conn: Connection,
        *,
        on_updates: Callable[[list[TokenUpdate]], None],
        on_exit: Callable[[str], None],
    ) -> None:
        self._process = process
        self._conn = conn
        self._on_updates = on_updates
        self._on_exit = on_exit
        self._loop = asyncio.get_running_loop()
        # Sends go through a thread of their own: a socket whose buffer an engine busy
        # elsewhere has let fill up would otherwise block the event loop.
        self._outgoing: queue.SimpleQueue[ToEngine | None] = queue.SimpleQueue()
        self._writer = threading.Thread(
            target=self._write, name=f"llm-engine-send-{process.pid}", daemon=True
        )
        self._writer.start()
        self._ready: asyncio.Future[EngineInfo] = self._loop.create_future()
        self._calls: dict[int, asyncio.Future[None]] = {}
        self._sequence = itertools.count()
        self._is_closing = False
        self._is_attached = True
        self._outbox: list[Add | Cancel] = []
        """Adds and cancels of this loop iteration, sent together at its end."""
        self.death: str | None = None
        """Why the engine is gone, once it died; None while it serves."""
        self.load: tuple[int, int] = (0, 0)
        """(running, waiting) as the engine last reported."""
        self._loop.add_reader(conn.fileno(), self._on_readable)

    @classmethod
    async def start(
        cls,
        model_dir: Path,
        device: str,
        parameters: Mapping[str, Any],
        *,
        fallback_eos_ids: frozenset[int],
        on_updates: Callable[[list[TokenUpdate]], None],
        on_exit: Callable[[str], None],
        timeout_s: float,
        spares: SpareEngineProcesses | None = None,
    ) -> tuple[EngineProcess, EngineInfo]:
        """Start a process (or take the spare one) and load ``model_dir`` in it.

        Raises EngineProcessError when the process cannot start, exits, or refuses the load,
        and TimeoutError after ``timeout_s``; the process is gone then.
        """
        spare = spares.take() if spares is not None else None
        if spare is None:
            spare = await asyncio.to_thread(spawn)
        if spares is not None:
            # The next load (after an unload, say) finds one with torch imported already.
            spares.refill()
        process, conn = spare
        handle = cls(process, conn, on_updates=on_updates, on_exit=on_exit)
        try:
            handle._send(LoadModel(str(model_dir), device, dict(parameters), fallback_eos_ids))
            async with asyncio.timeout(timeout_s):
                info = await handle._ready
        except BaseException:
            await asyncio.to_thread(handle.close)
            raise
        return handle, info

    @property
    def pid(self) -> int:
        return self._process.pid

    def add(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
    ) -> None:
        self._post(Add(request_id, list(prompt_ids), max_new_tokens, temperature, top_p))

    def cancel(self, request_id: str) -> None:
        self._post(Cancel(request_id))

    def _post(self, message: Add | Cancel) -> None:
        # Each message wakes the engine's command thread, which then waits for the
        # interpreter lock its generation thread holds; one message per loop iteration
        # carries every add and cancel of that iteration.
        if self.death is not None:
            raise EngineProcessError(self.death)
        if not self._outbox:
            self._loop.call_soon(self._flush)
        self._outbox.append(message)

    def _flush(self) -> None:
        messages, self._outbox = self._outbox, []
        try:
            self._send(Batch(messages))
        except EngineProcessError as exc:
            # The exit callback fails the requests these messages were for.
            logger.warning("%s", exc)

    async def call(self, name: CallName, *, timeout_s: float) -> None:
        """Run ``sleep`` or ``wake`` in the engine; raises EngineProcessError when it fails
        there or the process dies, TimeoutError after ``timeout_s``."""
        seq = next(self._sequence)
        future: asyncio.Future[None] = self._loop.create_future()
        self._calls[seq] = future
        if self._outbox:
            self._flush()  # what was asked before this call reaches the engine before it
        try:
            self._send(Call(seq, name))
            async with asyncio.timeout(timeout_s):
                await future
        finally:
            self._calls.pop(seq, None)

    def close(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop the engine and wait for the process to exit (killed after ``timeout_s``).

        Blocking; callable from any thread; idempotent.
        """
        self._is_closing = True
        self._outgoing.put(Stop())
        self._outgoing.put(None)
        try:
            self._process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            logger.error(
                "engine process %d did not stop in %.0f s; killing it", self.pid, timeout_s
            )
            self._process.kill()
            self._process.wait(timeout=timeout_s)
        self._writer.join(timeout=timeout_s)
        if self._loop.is_closed():
            self._conn.close()
        else:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self._loop.call_soon_threadsafe(self._detach)

    def _send(self, message: ToEngine) -> None:
        if self.death is not None:
            raise EngineProcessError(self.death)
        self._outgoing.put(message)

    def _write(self) -> None:
        while (message := self._outgoing.get()) is not None:
            try:
                self._conn.send(message)
            except (OSError, ValueError):  # ValueError: the connection is closed
                # The process is gone; the reader sees it and fails what was waiting.
                return

    def _detach(self) -> None:
        if self._is_attached:
            self._is_attached = False
            self._loop.remove_reader(self._conn.fileno())
            self._conn.close()

    def _on_readable(self) -> None:
        try:
            while self._conn.poll():
                self._dispatch(self._conn.recv())
        except (EOFError, OSError):
            code = self._process.poll()
            self._detach()
            self._lost(f"the engine process exited (code {code})")

    def _dispatch(self, message: FromEngine) -> None:
        match message:
            case Tokens(updates, running, waiting):
                self.load = (running, waiting)
                self._on_updates([TokenUpdate(*update) for update in updates])
            case LoadCounts(running, waiting):
                self.load = (running, waiting)
            case Reply(seq, error):
                future = self._calls.get(seq)
                if future is not None and not future.done():
                    if error is None:
                        future.set_result(None)
                    else:
                        future.set_exception(EngineProcessError(error))
            case Ready(max_model_len, eos_ids):
                if not self._ready.done():
                    self._ready.set_result(EngineInfo(max_model_len, frozenset(eos_ids)))
            case LoadFailed(reason):
                if not self._ready.done():
                    self._ready.set_exception(EngineProcessError(reason))
            case Fatal(reason):
                self._lost(reason)
            case _:
                logger.error("unexpected message %s from the engine", type(message).__name__)

    def _lost(self, reason: str) -> None:
        if self.death is not None:
            return
        self.death = reason
        error = EngineProcessError(reason)
        if not self._ready.done():
            self._ready.set_exception(error)
        for future in self._calls.values():
            if not future.done():
                future.set_exception(error)
        if not self._is_closing:
            self._on_exit(reason)


def spawn() -> tuple[subprocess.Popen[Any], Connection]:
    """Start an engine process; it imports the engine's packages and waits for a load.

    Blocking (a fork and an exec). Raises EngineProcessError.
    """
    ours, theirs = socket.socketpair()
    level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
    command = [sys.executable, "-m", _ENGINE_MODULE, "--fd", str(theirs.fileno())]
    command += ["--log-level", str(level)]
    try:
        process = subprocess.Popen(command, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
    except OSError as exc:
        ours.close()
        raise EngineProcessError(f"cannot start the engine process: {exc}") from exc
    finally:
        theirs.close()
    return process, Connection(ours.detach())


class SpareEngines:
    """One engine process kept started, with torch and transformers imported, for the next
    load: a reload then costs the weights, not an interpreter and its imports (seconds).

    A spare touches no GPU until it loads (importing torch does not create a CUDA context),
    so an unloaded model's process still exits and gives all of its memory back. Nothing is
    spawned before the first load asks; :meth:`close` stops the spare.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spare: tuple[subprocess.Popen[Any], Connection] | None = None
        self._is_closed = False

    @property
    def pid(self) -> int | None:
        """The spare's process id; None while there is none."""
        spare = self._spare
        return None if spare is None else spare[0].pid

    def take(self) -> tuple[subprocess.Popen[Any], Connection] | None:
        """The spare, if there is one still running."""
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is not None and spare[0].poll() is not None:
            spare[1].close()
            return None
        return spare

    def refill(self) -> None:
        """Start a spare unless there is one (in a thread; returns at once)."""
        threading.Thread(target=self._refill, name="llm-spare", daemon=True).start()

    def _refill(self) -> None:
        with self._lock:
            if self._spare is not None or self._is_closed:
                return
        try:
            spare = spawn()
        except EngineProcessError as exc:
            logger.warning("no spare engine process: %s", exc)
            return
        with self._lock:
            if self._spare is None and not self._is_closed:
                self._spare = spare
                return
        _stop_spare(spare)

    def close(self) -> None:
        """Stop the spare (blocking, bounded); later refills start none."""
        with self._lock:
            self._is_closed = True
            spare, self._spare = self._spare, None
        if spare is not None:
            _stop_spare(spare)


def _stop_spare(spare: tuple[subprocess.Popen[Any], Connection]) -> None:
    process, conn = spare
    conn.close()  # a waiting engine process exits when its socket closes
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=STOP_TIMEOUT_S)
