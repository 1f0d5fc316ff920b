"""The stub's channel without a reader thread: the waiting threads take turns reading.

In process, over a real socket pair: this test plays the server on one end, a
:class:`StubChannel` the stub's threads on the other. No duration is asserted; every wait
has a deadline.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from runtimes.python_backend import messages
from runtimes.python_backend.stub_channel import CLOSED, StubChannel

WAIT_S = 10.0


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, StubChannel]]:
    server, stub = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    server.settimeout(WAIT_S)
    try:
        yield server, StubChannel(messages.Channel(stub))
    finally:
        server.close()
        stub.close()


def test_the_main_thread_reads_its_own_work_and_no_thread_is_started(
    pair: tuple[socket.socket, StubChannel],
):
    server, channel = pair
    before = threading.active_count()
    messages.send(server, {"kind": "execute", "id": 1, "requests": []})
    messages.send(server, {"kind": "finalize"})

    assert channel.next_work()["id"] == 1
    assert channel.next_work()["kind"] == "finalize"
    assert threading.active_count() == before


def test_an_answer_reaches_its_waiter_while_the_main_thread_waits_for_work(
    pair: tuple[socket.socket, StubChannel],
):
    """A background question (a coroutine's BLS call) is answered by whichever thread
    reads: here the idle main thread, which then goes on to read its execute."""
    server, channel = pair
    work: list[messages.Message] = []
    main = threading.Thread(target=lambda: work.append(channel.next_work()))
    main.start()
    call, waiter = channel.ask({"kind": "is_cancelled", "id": 1, "request": 0})
    question = messages.receive(server)
    assert (question["kind"], question["call"]) == ("is_cancelled", call)

    messages.send(server, {"kind": "cancelled", "call": call, "value": True})
    assert waiter.next(WAIT_S) == {"kind": "cancelled", "call": call, "value": True}
    messages.send(server, {"kind": "execute", "id": 7, "requests": []})
    main.join(WAIT_S)
    assert [w["id"] for w in work] == [7]


def test_work_read_by_a_waiting_model_thread_goes_to_the_main_thread(
    pair: tuple[socket.socket, StubChannel],
):
    server, channel = pair
    call, waiter = channel.ask({"kind": "bls"})
    messages.receive(server)
    messages.send(server, {"kind": "execute", "id": 2, "requests": []})
    messages.send(server, {"kind": "bls_result", "call": call, "final": True})

    assert waiter.next(WAIT_S)["kind"] == "bls_result"
    assert channel.next_work()["id"] == 2


def test_a_deadline_is_kept_while_another_thread_holds_the_read(
    pair: tuple[socket.socket, StubChannel],
):
    _, channel = pair
    idle_main = threading.Thread(target=channel.next_work, daemon=True)
    idle_main.start()
    _, waiter = channel.ask({"kind": "bls"})

    with pytest.raises(TimeoutError):
        waiter.next(0.05)


def test_every_waiter_and_the_main_thread_learn_that_the_server_went_away(
    pair: tuple[socket.socket, StubChannel],
):
    server, channel = pair
    _, waiter = channel.ask({"kind": "bls"})
    answers: list[messages.Message] = []
    other = threading.Thread(target=lambda: answers.append(waiter.next(WAIT_S)))
    other.start()
    server.close()

    assert channel.next_work() is CLOSED
    other.join(WAIT_S)
    assert answers == [CLOSED]
    _, late = channel.ask({"kind": "bls"})
    assert late.next(WAIT_S) is CLOSED
