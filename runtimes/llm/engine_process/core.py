"""The engine process's side: one :class:`~runtimes.llm.hf_engine.HFEngine` driven by the
server's messages (:mod:`runtimes.llm.engine_process.messages`).

Started by the server's client (:func:`runtimes.llm.engine_process.client.spawn`) as

    python -m runtimes.llm.engine_process --fd N [--log-level LEVEL]

It imports the engine's packages, waits for :class:`LoadModel`, then carries out commands
until :class:`Stop` or until the server's end of the socket closes, so it never outlives
the server. Token updates go out from the engine's generation thread as each step ends; a
reporter thread sends the queue counts when no tokens carry them, and the engine's death.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Final, NoReturn

from runtimes.llm.engine_process.messages import (
    Add,
    Batch,
    Call,
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
    WireUpdate,
)
from runtimes.llm.hf_engine import EngineLoadError, HFEngine, TokenUpdate

logger = logging.getLogger(__name__)

_LOAD_REPORT_S: Final = 0.1
"""How often an engine process reports its load when no tokens carry it."""

_SWITCH_INTERVAL_S: Final = 0.0005
"""The engine process's interpreter switch interval (Python's default: 5 ms)."""


class EngineCore:
    """One HFEngine driven by the server's messages over ``conn``."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._send_lock = threading.Lock()
        self._engine: HFEngine | None = None
        self._stopped = threading.Event()
        self._reported: tuple[int, int] | None = None
        """The load the server was told last, by either message that carries it."""

    def send(self, message: FromEngine) -> None:
        try:
            with self._send_lock:
                self._conn.send(message)
        except OSError:
            # The server is gone; the command loop sees the closed socket and exits.
            self._stopped.set()

    def serve(self) -> int:
        """Load, then serve until told to stop; the process's exit code."""
        # Imported before the load arrives, so that a spare process has them ready: the
        # generic half of transformers' loading and batching code takes as long to import
        # as torch (about 2 s each here); only the model's own module is left for the load.
        import torch  # noqa: F401
        import transformers.generation.continuous_batching.continuous_api
        import transformers.modeling_utils  # noqa: F401
        from transformers import AutoModelForCausalLM  # noqa: F401

        try:
            first: ToEngine = self._conn.recv()
        except EOFError:
            return 0
        if not isinstance(first, LoadModel):
            logger.error("expected a LoadModel message first, got %s", type(first).__name__)
            return 1
        try:
            engine = HFEngine.load(
                Path(first.folder),
                first.device,
                first.parameters,
                fallback_eos_ids=first.fallback_eos_ids,
            )
        except EngineLoadError as exc:
            self.send(LoadFailed(str(exc)))
            return 1
        except Exception as exc:
            logger.exception("loading %s failed", first.folder)
            self.send(LoadFailed(f"{type(exc).__name__}: {exc}"))
            return 1
        self._engine = engine
        engine.set_sink(self._send_updates)
        self.send(Ready(engine.info.max_model_len, tuple(sorted(engine.info.eos_ids))))
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
                message: ToEngine = self._conn.recv()
            except (EOFError, OSError):
                return
            match message:
                case Batch(commands):
                    for command in commands:
                        _command(engine, command)
                case Call(seq, name):
                    self.send(Reply(seq, _call(engine, name)))
                case Stop():
                    return
                case _:
                    logger.error("unexpected message %s", type(message).__name__)

    def _send_updates(self, updates: list[TokenUpdate]) -> None:
        engine = self._engine
        running, waiting = engine.load_counts() if engine is not None else (0, 0)
        wire: list[WireUpdate] = [(u.request_id, u.tokens, u.is_finished, u.error) for u in updates]
        self._reported = (running, waiting)
        self.send(Tokens(wire, running, waiting))

    def _report_load(self) -> None:
        # Tokens carry the load while requests run; this reports the change when they end,
        # and a generation thread that died (the server then fails what runs and exits).
        while not self._stopped.wait(_LOAD_REPORT_S):
            engine = self._engine
            if engine is None:
                continue
            fatal = engine.fatal_error()
            if fatal is not None:
                logger.error("%s", fatal)
                self.send(Fatal(fatal))
                return
            try:
                load = engine.load_counts()
            except Exception:  # managers replaced under us (sleep, wake): next round
                continue
            if load != self._reported:
                self._reported = load
                self.send(LoadCounts(*load))


def _command(engine: HFEngine, command: Add | Cancel) -> None:
    match command:
        case Add():
            engine.add(
                command.request_id,
                command.prompt_ids,
                max_new_tokens=command.max_new_tokens,
                temperature=command.temperature,
                top_p=command.top_p,
            )
        case Cancel(request_id):
            engine.cancel(request_id)


def _call(engine: HFEngine, name: str) -> str | None:
    """Run ``name``; None, or why it failed."""
    try:
        if name == "sleep":
            engine.sleep()
        elif name == "wake":
            engine.wake()
        else:
            return f"unknown call {name!r}"
    except Exception as exc:
        logger.exception("%s failed", name)
        return f"{name} failed: {exc}"
    return None


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
    code = EngineCore(Connection(args.fd)).serve()
    # The engine is freed; skip the interpreter's teardown of torch (a second or more).
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
