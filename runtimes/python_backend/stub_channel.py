"""The stub's end of the channel, shared by the threads of a stub process.

The main thread serves the server's work (``init``, ``execute``, ``finalize``,
``auto_complete``) in order; other threads (a model's BLS calls, response senders,
``is_cancelled``, the coroutines of an ``async def execute``) wait for answers to their
questions (``cancelled``, ``response_done``, ``bls_result``), found by their ``call`` id.

There is no reader thread: whichever thread is waiting reads the socket (a leader and
followers). One waiting thread at a time is the reader; it takes one message, files it
(work in the main thread's queue, an answer with its waiter), hands the role on and
wakes the others, who each look for what they wait for before one of them reads next. So
the common case, the main thread idle between executions, reads its ``execute`` itself
and runs it with no thread switch in between (a reader thread handing each ``execute``
to the main thread cost a wake-up and a GIL handover per execution); and a model blocked
in ``execute`` on a BLS call reads its own answer, while a coroutine of a background
``async def execute`` is answered by whichever thread reads, the idle main thread
included.

A reader blocks in ``recv`` at most :data:`READ_SLICE_S` at a time, so that a thread whose
own wait has a deadline never waits past it behind another's read.

Standard library only (numpy comes with ``tensors``, imported by the model host).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Final

from runtimes.python_backend import messages
from runtimes.python_backend.messages import Message

MAIN_KINDS: Final = frozenset(("init", "execute", "finalize", "auto_complete"))
"""Kinds the main thread serves, in order."""
CLOSED: Final[Message] = {"kind": "closed"}
"""What every waiter gets when the server went away."""
READ_SLICE_S: Final = 0.25
"""The longest one read blocks before the reader looks at its deadline again."""


class Waiter:
    """The answers to one question (a BLS call has several), in order."""

    def __init__(self, channel: StubChannel) -> None:
        self._channel = channel
        self._answers: deque[Message] = deque()

    def deliver(self, message: Message) -> None:
        """File an answer (the caller holds the channel's lock)."""
        self._answers.append(message)

    def take(self) -> Message | None:
        """The next answer filed, if any (the caller holds the channel's lock)."""
        return self._answers.popleft() if self._answers else None

    def next(self, timeout_s: float) -> Message:
        """The next answer; TimeoutError past ``timeout_s``. :data:`CLOSED` once the server
        is gone."""
        return self._channel.wait_for(self.take, timeout_s)


class StubChannel:
    """Sends from any thread; the waiting threads take turns reading.

    Parameters:
        channel: the framed socket (blocking).
        on_message: called for each answer before it is filed, by the thread that read it
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
        # Taken directly (a plain lock's context manager is C; the Condition's is Python)
        # and waited on through the Condition built on it.
        self._mutex = threading.Lock()
        self._lock = threading.Condition(self._mutex)
        # Threads waiting in the Condition: a reader that finds none notifies nobody.
        self._followers = 0
        self._waiters: dict[int, Waiter] = {}
        self._ids = itertools.count(1)
        self._work: deque[Message] = deque()
        self._is_closed = False
        self._is_reading = False

    def send(self, message: Message) -> None:
        with self._send_lock:
            self._channel.send(message)

    def next_work(self) -> Message:
        """The main thread's next message; :data:`CLOSED` when the server went away."""
        return self.wait_for(self._take_work, None)

    def ask(self, message: Message) -> tuple[int, Waiter]:
        """Send ``message`` with a new ``call`` id; its answers go to the waiter."""
        waiter = Waiter(self)
        with self._mutex:
            call = next(self._ids)
            if self._is_closed:
                waiter.deliver(CLOSED)
                return call, waiter
            self._waiters[call] = waiter
        self.send({**message, "call": call})
        return call, waiter

    def forget(self, call: int) -> None:
        """No more answers are awaited for ``call``."""
        with self._mutex:
            self._waiters.pop(call, None)

    def wait_for(self, take: Callable[[], Message | None], timeout_s: float | None) -> Message:
        """What ``take`` finds (called under the lock), reading the socket in turn with
        the other waiting threads until it finds something; :data:`CLOSED` once the
        server is gone and nothing is left to take. TimeoutError past ``timeout_s``
        (None: no limit)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            with self._mutex:
                while True:
                    found = take()
                    if found is not None:
                        return found
                    if self._is_closed:
                        return CLOSED
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise TimeoutError(f"no answer from the server within {timeout_s} s")
                    if not self._is_reading:
                        self._is_reading = True
                        break
                    self._followers += 1
                    try:
                        self._lock.wait(remaining)
                    finally:
                        self._followers -= 1
            self._read_one()

    def _take_work(self) -> Message | None:
        return self._work.popleft() if self._work else None

    def _read_one(self) -> None:
        """As the reader: take one message (or none within a slice), file it, and hand
        the role on."""
        message: Message | None = None
        is_closed = False
        try:
            message = self._channel.receive(READ_SLICE_S)
        except TimeoutError:
            pass
        except (messages.ChannelClosedError, OSError, ValueError):
            is_closed = True
        if message is not None and message["kind"] not in MAIN_KINDS:
            if self._on_message is not None:
                message = self._on_message(message)
        with self._mutex:
            self._is_reading = False
            if is_closed:
                self._close()
            elif message is not None:
                self._file(message)
            if self._followers:
                self._lock.notify_all()

    def _file(self, message: Message) -> None:
        if message["kind"] in MAIN_KINDS:
            self._work.append(message)
            return
        waiter = self._waiters.get(int(message.get("call", 0)))
        if waiter is not None:
            waiter.deliver(message)

    def _close(self) -> None:
        self._is_closed = True
        waiters, self._waiters = list(self._waiters.values()), {}
        for waiter in waiters:
            waiter.deliver(CLOSED)
