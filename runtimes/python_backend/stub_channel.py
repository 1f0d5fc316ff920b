"""The stub's end of the channel, shared by the threads of a stub process.

A reader thread takes every message the server sends: the work of the main thread
(``init``, ``execute``, ``finalize``, ``auto_complete``) goes to a queue the main thread
serves; answers to what a model thread asked (``cancelled``, ``response_done``,
``bls_result``) go straight to the waiter of that question, found by its ``call`` id.
So a model blocked in ``execute`` on a BLS call, a response sender waiting for its
acknowledgement, or a coroutine of an ``async def execute`` awaiting a call, is answered
while the main thread is busy; nothing waits on the main thread to read for it.

Standard library only (numpy comes with ``tensors``, imported by the model host).
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable
from typing import Final

from runtimes.python_backend import messages
from runtimes.python_backend.messages import Message

MAIN_KINDS: Final = frozenset(("init", "execute", "finalize", "auto_complete"))
"""Kinds the main thread serves, in order."""
CLOSED: Final[Message] = {"kind": "closed"}
"""What every waiter gets when the server went away."""


class Waiter:
    """The answers to one question (a BLS call has several), in order."""

    def __init__(self) -> None:
        self._answers: queue.SimpleQueue[Message] = queue.SimpleQueue()

    def deliver(self, message: Message) -> None:
        self._answers.put(message)

    def next(self, timeout_s: float) -> Message:
        """The next answer; TimeoutError past ``timeout_s``. :data:`CLOSED` once the server
        is gone."""
        try:
            return self._answers.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(f"no answer from the server within {timeout_s} s") from None


class StubChannel:
    """Sends from any thread; one reader thread receives.

    Parameters:
        channel: the framed socket.
        on_message: called on the reader thread for each answer before it is delivered
            (the model host copies a BLS result's tensors out and releases their blocks
            there, whatever the waiter does next).
    """

    def __init__(
        self,
        channel: messages.Channel,
        on_message: Callable[[Message], Message] | None = None,
    ) -> None:
        self._channel = channel
        self._on_message = on_message
        self._send_lock = threading.Lock()
        self._waiters: dict[int, Waiter] = {}
        self._waiters_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._work: queue.SimpleQueue[Message] = queue.SimpleQueue()
        self._is_closed = False
        self._reader: threading.Thread | None = None

    def start(self) -> None:
        self._reader = threading.Thread(target=self._read, name="stub-channel", daemon=True)
        self._reader.start()

    def send(self, message: Message) -> None:
        with self._send_lock:
            self._channel.send(message)

    def next_work(self) -> Message:
        """The main thread's next message; :data:`CLOSED` when the server went away."""
        return self._work.get()

    def ask(self, message: Message) -> tuple[int, Waiter]:
        """Send ``message`` with a new ``call`` id; its answers go to the waiter."""
        waiter = Waiter()
        with self._waiters_lock:
            call = next(self._ids)
            if self._is_closed:
                waiter.deliver(CLOSED)
                return call, waiter
            self._waiters[call] = waiter
        self.send({**message, "call": call})
        return call, waiter

    def forget(self, call: int) -> None:
        """No more answers are awaited for ``call``."""
        with self._waiters_lock:
            self._waiters.pop(call, None)

    def _read(self) -> None:
        while True:
            try:
                message = self._channel.receive()
            except (messages.ChannelClosedError, OSError, ValueError):
                break
            if message["kind"] in MAIN_KINDS:
                self._work.put(message)
                continue
            if self._on_message is not None:
                message = self._on_message(message)
            with self._waiters_lock:
                waiter = self._waiters.get(int(message.get("call", 0)))
            if waiter is not None:
                waiter.deliver(message)
        with self._waiters_lock:
            self._is_closed = True
            waiters, self._waiters = list(self._waiters.values()), {}
        for waiter in waiters:
            waiter.deliver(CLOSED)
        self._work.put(CLOSED)
