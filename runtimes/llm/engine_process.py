"""The transformers engine in a process of its own, and the server's handle on it.

With the engine in the server's process, its generation thread and the HTTP streaming of its
tokens share one interpreter lock, and the worker never uses more than one core: on a small
model the engine ran at 0.73 of its speed alone. vLLM runs its engine core in a separate
process for the same reason; so do we. The server keeps the tokenizer (encoding, chat
templates, detokenization and stop strings stay where the text is); only token ids cross.

The two ends talk over a socket pair with :class:`multiprocessing.connection.Connection`
framing (pickles between these two processes only; nothing read from storage is unpickled).
Parent to engine: ``("load", folder, device, parameters, fallback_eos)`` first, then
``("batch", [("add", id, prompt_ids, max_new_tokens, temperature, top_p) | ("cancel",
id), ...])``, ``("call", seq, "sleep" | "wake")`` and ``("stop",)``. Engine to parent: ``("ready",
max_model_len, eos_ids)`` or ``("load_error", reason)``, then ``("tokens", updates, running,
waiting)``, ``("load", running, waiting)``, ``("reply", seq, error | None)`` and ``("fatal",
reason)``. The engine exits when the parent's end closes, so it never outlives the server.

    python -m runtimes.llm.engine_process --fd N [--log-level LEVEL]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import os
import queue
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NoReturn

from runtimes.llm.hf_engine import EngineInfo, EngineLoadError, HFEngine, TokenUpdate

if TYPE_CHECKING:
    # Types only: the engine process itself runs without the runtime interface.
    from runtimes.base import SpareEngineProcesses

logger = logging.getLogger(__name__)

STOP_TIMEOUT_S: Final = 60.0
"""How long a stopping engine process may take to free its engine and exit."""

_LOAD_REPORT_S: Final = 0.1
"""How often an engine process reports its load when no tokens carry it."""

_SWITCH_INTERVAL_S: Final = 0.0005
"""The engine process's interpreter switch interval (Python's default: 5 ms)."""

Update = tuple[str, tuple[int, ...], bool, str | None]
"""A :class:`TokenUpdate` on the wire: request id, new tokens, finished, error."""


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
        self._outgoing: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._writer = threading.Thread(
            target=self._write, name=f"llm-engine-send-{process.pid}", daemon=True
        )
        self._writer.start()
        self._ready: asyncio.Future[EngineInfo] = self._loop.create_future()
        self._calls: dict[int, asyncio.Future[None]] = {}
        self._sequence = itertools.count()
        self._is_closing = False
        self._is_attached = True
        self._outbox: list[tuple[Any, ...]] = []
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
            handle._send(("load", str(model_dir), device, dict(parameters), fallback_eos_ids))
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
        self._post(("add", request_id, list(prompt_ids), max_new_tokens, temperature, top_p))

    def cancel(self, request_id: str) -> None:
        self._post(("cancel", request_id))

    def _post(self, message: tuple[Any, ...]) -> None:
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
            self._send(("batch", messages))
        except EngineProcessError as exc:
            # The exit callback fails the requests these messages were for.
            logger.warning("%s", exc)

    async def call(self, name: str, *, timeout_s: float) -> None:
        """Run ``sleep`` or ``wake`` in the engine; raises EngineProcessError when it fails
        there or the process dies, TimeoutError after ``timeout_s``."""
        seq = next(self._sequence)
        future: asyncio.Future[None] = self._loop.create_future()
        self._calls[seq] = future
        if self._outbox:
            self._flush()  # what was asked before this call reaches the engine before it
        try:
            self._send(("call", seq, name))
            async with asyncio.timeout(timeout_s):
                await future
        finally:
            self._calls.pop(seq, None)

    def close(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop the engine and wait for the process to exit (killed after ``timeout_s``).

        Blocking; callable from any thread; idempotent.
        """
        self._is_closing = True
        self._outgoing.put(("stop",))
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

    def _send(self, message: tuple[Any, ...]) -> None:
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

    def _dispatch(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "tokens":
            _, updates, running, waiting = message
            self.load = (running, waiting)
            self._on_updates([TokenUpdate(*u) for u in updates])
        elif kind == "load":
            self.load = (message[1], message[2])
        elif kind == "reply":
            _, seq, error = message
            future = self._calls.get(seq)
            if future is not None and not future.done():
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(EngineProcessError(error))
        elif kind == "ready":
            if not self._ready.done():
                self._ready.set_result(EngineInfo(message[1], frozenset(message[2])))
        elif kind == "load_error":
            if not self._ready.done():
                self._ready.set_exception(EngineProcessError(message[1]))
        elif kind == "fatal":
            self._lost(message[1])

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
    command = [sys.executable, "-m", __name__, "--fd", str(theirs.fileno())]
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


# ---- the engine process ----


class _Engine:
    """The engine process's side: one HFEngine driven by the parent's messages."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._send_lock = threading.Lock()
        self._engine: HFEngine | None = None
        self._stopped = threading.Event()
        self._reported: tuple[int, int] | None = None
        """The load the parent was told last, by either message that carries it."""

    def send(self, message: tuple[Any, ...]) -> None:
        try:
            with self._send_lock:
                self._conn.send(message)
        except OSError:
            # The parent is gone; the command loop sees the closed socket and exits.
            self._stopped.set()

    def serve(self) -> int:
        # Imported before the load arrives, so that a spare process has them ready: the
        # generic half of transformers' loading and batching code takes as long to import
        # as torch (about 2 s each here); only the model's own module is left for the load.
        import torch  # noqa: F401
        import transformers.generation.continuous_batching.continuous_api
        import transformers.modeling_utils  # noqa: F401
        from transformers import AutoModelForCausalLM  # noqa: F401

        try:
            first = self._conn.recv()
        except EOFError:
            return 0
        _, folder, device, parameters, fallback_eos = first
        try:
            engine = HFEngine.load(
                Path(folder), device, parameters, fallback_eos_ids=frozenset(fallback_eos)
            )
        except EngineLoadError as exc:
            self.send(("load_error", str(exc)))
            return 1
        except Exception as exc:
            logger.exception("loading %s failed", folder)
            self.send(("load_error", f"{type(exc).__name__}: {exc}"))
            return 1
        self._engine = engine
        engine.set_sink(self._send_updates)
        self.send(("ready", engine.info.max_model_len, sorted(engine.info.eos_ids)))
        reporter = threading.Thread(target=self._report_load, name="llm-load", daemon=True)
        reporter.start()
        try:
            self._commands(engine)
        finally:
            self._stopped.set()
            engine.close()
        return 0

    def _commands(self, engine: HFEngine) -> None:
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                return
            for one in message[1] if message[0] == "batch" else (message,):
                if not self._command(engine, one):
                    return

    def _command(self, engine: HFEngine, message: tuple[Any, ...]) -> bool:
        """Carry out one message; False for ``stop``."""
        kind = message[0]
        if kind == "add":
            _, request_id, prompt_ids, max_new_tokens, temperature, top_p = message
            engine.add(
                request_id,
                prompt_ids,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                top_p=top_p,
            )
        elif kind == "cancel":
            engine.cancel(message[1])
        elif kind == "call":
            _, seq, name = message
            error = None
            try:
                if name == "sleep":
                    engine.sleep()
                elif name == "wake":
                    engine.wake()
                else:
                    error = f"unknown call {name!r}"
            except Exception as exc:
                logger.exception("%s failed", name)
                error = f"{name} failed: {exc}"
            self.send(("reply", seq, error))
        elif kind == "stop":
            return False
        return True

    def _send_updates(self, updates: list[TokenUpdate]) -> None:
        engine = self._engine
        load = engine.load_counts() if engine is not None else (0, 0)
        wire: list[Update] = [(u.request_id, u.tokens, u.is_finished, u.error) for u in updates]
        self._reported = load
        self.send(("tokens", wire, *load))

    def _report_load(self) -> None:
        # Tokens carry the load while requests run; this reports the change when they end,
        # and a generation thread that died (the parent then fails what runs and exits).
        while not self._stopped.wait(_LOAD_REPORT_S):
            engine = self._engine
            if engine is None:
                continue
            fatal = engine.fatal_error()
            if fatal is not None:
                logger.error("%s", fatal)
                self.send(("fatal", fatal))
                return
            try:
                load = engine.load_counts()
            except Exception:  # managers replaced under us (sleep, wake): next round
                continue
            if load != self._reported:
                self._reported = load
                self.send(("load", *load))


def main(argv: list[str] | None = None) -> NoReturn:
    parser = argparse.ArgumentParser(description="zeroserve's transformers engine process")
    parser.add_argument("--fd", type=int, required=True, help="the socket to the server")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    # The command thread takes the interpreter lock from a busy generation thread only at
    # a forced switch; at the default 5 ms every add would wait that long.
    sys.setswitchinterval(_SWITCH_INTERVAL_S)
    logging.basicConfig(
        level=args.log_level,
        format=f"%(asctime)s %(levelname)s engine[{os.getpid()}] %(name)s: %(message)s",
    )
    code = _Engine(Connection(args.fd)).serve()
    # The engine is freed; skip the interpreter's teardown of torch (a second or more).
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
