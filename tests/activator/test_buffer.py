"""The buffer through its public seam: ``wait``, replica events, grants and ``close``.

Deadlines are event-loop times: far in the future where they must not fire, and already
past where they must (the timer then fires on the next loop turn), so nothing here waits
on the wall clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from activator.buffer import Buffer, Grant
from activator.errors import (
    ActivationFailedError,
    BufferFullError,
    ColdStartTimeoutError,
    ShuttingDownError,
)
from activator.lb import Replica
from foundation.errors import ModelFailedError
from tests.activator.fakes import RecordingActivate, settle

pytestmark = pytest.mark.anyio

MODEL = "mlp"


class _Replicas:
    def __init__(self) -> None:
        self.by_model: dict[str, list[Replica]] = {}

    def replicas(self, model: str) -> Sequence[Replica]:
        return self.by_model.get(model, [])


def _buffer(
    activate: RecordingActivate,
    replicas: _Replicas | None = None,
    *,
    max_requests: int = 100,
    release_concurrency: int = 2,
    activation_timeout_s: float = 60.0,
) -> Buffer:
    return Buffer(
        activate,
        replicas or _Replicas(),
        max_requests=max_requests,
        release_concurrency=release_concurrency,
        activation_timeout_s=activation_timeout_s,
        retry_after_s=3,
    )


def _later() -> float:
    return asyncio.get_running_loop().time() + 3600


def _past() -> float:
    return asyncio.get_running_loop().time() - 1


def _start(buffer: Buffer, count: int) -> list[asyncio.Task[Grant]]:
    return [asyncio.create_task(buffer.wait(MODEL, deadline=_later())) for _ in range(count)]


def _granted(tasks: list[asyncio.Task[Grant]]) -> list[Grant]:
    return [t.result() for t in tasks if t.done()]


async def test_a_burst_activates_once_and_drains_at_the_release_rate() -> None:
    activate = RecordingActivate()
    buffer = _buffer(activate, release_concurrency=3)
    tasks = _start(buffer, 50)
    await settle()
    assert activate.calls == [MODEL]
    assert buffer.is_waiting(MODEL)
    assert buffer.waiting(MODEL) == 50

    replica = Replica("w1", "http://w1")
    buffer.replica_added(MODEL, replica)
    await settle()
    first = _granted(tasks)
    assert len(first) == 3
    assert all(g.replica is replica for g in first)
    assert buffer.waiting(MODEL) == 47

    # Each finished request lets exactly one more go, never more than 3 at once.
    finished = 0
    while finished < 50:
        in_flight = [g for g in _granted(tasks)][finished:]
        assert 0 < len(in_flight) <= 3
        in_flight[0].release()
        finished += 1
        await settle()
    assert all(t.done() for t in tasks)
    assert not buffer.is_waiting(MODEL)
    assert buffer.waiting(MODEL) == 0
    assert activate.calls == [MODEL]
    await buffer.close()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_slots_are_per_replica_and_waiters_spread() -> None:
    buffer = _buffer(RecordingActivate(), release_concurrency=2)
    tasks = _start(buffer, 6)
    await settle()
    a, b = Replica("a", "http://a"), Replica("b", "http://b")
    buffer.replica_added(MODEL, a)
    await settle()
    assert [g.replica for g in _granted(tasks)] == [a, a]
    buffer.replica_added(MODEL, b)
    await settle()
    assert [g.replica for g in _granted(tasks)] == [a, a, b, b]
    # A slot handed back on b goes to the next waiter, on b.
    _granted(tasks)[2].release()
    await settle()
    assert _granted(tasks)[4].replica is b
    await buffer.close()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_new_arrivals_go_to_the_replica_with_most_free_slots() -> None:
    replicas = _Replicas()
    a, b = Replica("a", "http://a"), Replica("b", "http://b")
    buffer = _buffer(RecordingActivate(), replicas, release_concurrency=2)
    tasks = _start(buffer, 5)
    await settle()
    buffer.replica_added(MODEL, a)
    buffer.replica_added(MODEL, b)
    await settle()
    # a got 2 (while alone), b got 2; one waits.
    assert [g.replica for g in _granted(tasks)] == [a, a, b, b]
    _granted(tasks)[0].release()
    await settle()
    assert _granted(tasks)[4].replica is a
    await buffer.close()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_overflow_raises_buffer_full_with_retry_after() -> None:
    buffer = _buffer(RecordingActivate(), max_requests=2)
    tasks = _start(buffer, 2)
    await settle()
    with pytest.raises(BufferFullError) as caught:
        await buffer.wait(MODEL, deadline=_later())
    assert caught.value.retry_after_s == 3
    assert caught.value.model == MODEL
    assert "request buffer is full (2 requests waiting)" in caught.value.message
    assert buffer.waiting(MODEL) == 2
    await buffer.close()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_requeued_request_goes_first_and_ignores_the_bound() -> None:
    buffer = _buffer(RecordingActivate(), max_requests=2, release_concurrency=1)
    tasks = _start(buffer, 2)
    await settle()
    retry = asyncio.create_task(buffer.wait(MODEL, deadline=_later(), requeue=True))
    await settle()
    assert buffer.waiting(MODEL) == 3
    buffer.replica_added(MODEL, Replica("a", "http://a"))
    await settle()
    assert retry.done()
    assert not any(t.done() for t in tasks)
    await buffer.close()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_requeued_request_may_start_a_queue() -> None:
    activate = RecordingActivate()
    buffer = _buffer(activate)
    task = asyncio.create_task(buffer.wait(MODEL, deadline=_later(), requeue=True))
    await settle()
    assert activate.calls == [MODEL]
    buffer.replica_added(MODEL, Replica("a", "http://a"))
    await settle()
    assert task.done()
    await buffer.close()


async def test_the_deadline_raises_activation_timeout() -> None:
    buffer = _buffer(RecordingActivate(), activation_timeout_s=42)
    with pytest.raises(ColdStartTimeoutError) as caught:
        await buffer.wait(MODEL, deadline=_past())
    assert caught.value.retry_after_s == 3
    assert caught.value.message == "model 'mlp' did not become ready within 42 s"
    assert not buffer.is_waiting(MODEL)
    await buffer.close()


async def test_a_failed_activation_fails_its_burst_and_the_next_burst_activates_again() -> None:
    gate = asyncio.Event()
    activate = RecordingActivate(error=RuntimeError("no worker has room"), gate=gate)
    buffer = _buffer(activate)
    tasks = _start(buffer, 3)
    await settle()
    gate.set()
    await settle()
    for task in tasks:
        error = task.exception()
        assert isinstance(error, ActivationFailedError)
        assert error.message == "model 'mlp' could not be activated: no worker has room"
        assert error.retry_after_s == 3
    assert tasks[0].exception() is not tasks[1].exception()
    assert not buffer.is_waiting(MODEL)

    activate.error = None
    again = _start(buffer, 1)
    await settle()
    assert activate.calls == [MODEL, MODEL]
    await buffer.close()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.gather(*again, return_exceptions=True)


async def test_an_activation_error_without_message_names_its_type() -> None:
    buffer = _buffer(RecordingActivate(error=ConnectionError()))
    with pytest.raises(ActivationFailedError, match="could not be activated: ConnectionError"):
        await buffer.wait(MODEL, deadline=_later())
    await buffer.close()


async def test_an_activation_call_that_hangs_is_bounded() -> None:
    activate = RecordingActivate(gate=asyncio.Event())
    buffer = _buffer(activate, activation_timeout_s=0)
    with pytest.raises(ActivationFailedError, match="call took longer than 0 s"):
        await buffer.wait(MODEL, deadline=_later())
    await buffer.close()


async def test_a_failure_after_a_replica_came_is_ignored() -> None:
    gate = asyncio.Event()
    activate = RecordingActivate(error=RuntimeError("late"), gate=gate)
    buffer = _buffer(activate, release_concurrency=1)
    tasks = _start(buffer, 2)
    await settle()
    buffer.replica_added(MODEL, Replica("a", "http://a"))
    gate.set()
    await settle()
    assert tasks[0].done() and not tasks[1].done()
    assert buffer.waiting(MODEL) == 1
    tasks[0].result().release()
    await settle()
    assert tasks[1].done()
    await buffer.close()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_failure_for_a_burst_that_ended_spares_the_next() -> None:
    gate = asyncio.Event()
    activate = RecordingActivate(error=RuntimeError("late"), gate=gate)
    buffer = _buffer(activate)
    first = _start(buffer, 1)
    await settle()
    first[0].cancel()
    await settle()
    assert not buffer.is_waiting(MODEL)
    second = _start(buffer, 1)
    await settle()
    # Both activations are held by the gate; both fail once it opens, but only the second
    # one's burst is still there to fail.
    assert activate.calls == [MODEL, MODEL]
    gate.set()
    await settle()
    assert isinstance(second[0].exception(), ActivationFailedError)
    await buffer.close()


async def test_known_replicas_grant_at_once_without_activation() -> None:
    replicas = _Replicas()
    a = Replica("a", "http://a")
    replicas.by_model[MODEL] = [a]
    activate = RecordingActivate()
    buffer = _buffer(activate, replicas)
    grant = await buffer.wait(MODEL, deadline=_later())
    assert grant.replica is a
    assert activate.calls == []
    assert not buffer.is_waiting(MODEL)
    grant.release()  # its queue is gone: nothing to give back to
    await buffer.close()


async def test_losing_the_last_replica_activates_again() -> None:
    activate = RecordingActivate()
    buffer = _buffer(activate, release_concurrency=1)
    tasks = _start(buffer, 3)
    await settle()
    a = Replica("a", "http://a")
    buffer.replica_added(MODEL, a)
    await settle()
    assert activate.calls == [MODEL]
    buffer.replica_removed(MODEL, a)
    await settle()
    assert activate.calls == [MODEL, MODEL]
    # The grant on the removed replica gives nothing back.
    _granted(tasks)[0].release()
    await settle()
    assert buffer.waiting(MODEL) == 2
    await buffer.close()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_losing_one_of_two_replicas_does_not_activate() -> None:
    activate = RecordingActivate()
    buffer = _buffer(activate, release_concurrency=1)
    tasks = _start(buffer, 3)
    await settle()
    a, b = Replica("a", "http://a"), Replica("b", "http://b")
    buffer.replica_added(MODEL, a)
    buffer.replica_added(MODEL, b)
    buffer.replica_removed(MODEL, a)
    await settle()
    assert activate.calls == [MODEL]
    await buffer.close()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_replica_events_without_a_queue_are_ignored() -> None:
    activate = RecordingActivate()
    buffer = _buffer(activate)
    a = Replica("a", "http://a")
    buffer.replica_added(MODEL, a)
    buffer.replica_removed(MODEL, a)
    tasks = _start(buffer, 1)
    await settle()
    buffer.replica_removed(MODEL, Replica("unknown", "http://unknown"))
    await settle()
    assert activate.calls == [MODEL]
    assert buffer.waiting(MODEL) == 1
    await buffer.close()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_waiter_cancelled_while_waiting_leaves_the_queue() -> None:
    buffer = _buffer(RecordingActivate(), release_concurrency=1)
    tasks = _start(buffer, 2)
    await settle()
    tasks[0].cancel()
    # The cancelled waiter is still at the front when the replica comes: it is skipped.
    buffer.replica_added(MODEL, Replica("a", "http://a"))
    await settle()
    assert tasks[0].cancelled()
    assert tasks[1].done()
    assert not buffer.is_waiting(MODEL)
    await buffer.close()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_waiter_cancelled_right_after_its_grant_passes_the_slot_on() -> None:
    buffer = _buffer(RecordingActivate(), release_concurrency=1)
    tasks = _start(buffer, 2)
    await settle()
    buffer.replica_added(MODEL, Replica("a", "http://a"))
    tasks[0].cancel()  # granted in this same turn, not yet resumed
    await settle()
    assert tasks[0].cancelled()
    assert tasks[1].done()
    await buffer.close()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_waiter_cancelled_right_after_failing_just_goes() -> None:
    buffer = _buffer(RecordingActivate())
    tasks = _start(buffer, 2)
    await settle()
    tasks[0].cancel()  # cancelled, not yet resumed: its queue still counts it
    await buffer.close()  # fails the other waiter and drops the queue
    tasks[1].cancel()  # failed in this turn, not yet resumed
    await settle()
    assert tasks[0].cancelled() and tasks[1].cancelled()
    with pytest.raises(ShuttingDownError):
        await buffer.wait(MODEL, deadline=_later())


async def test_a_deadline_firing_after_a_cancel_in_the_same_turn_does_nothing() -> None:
    buffer = _buffer(RecordingActivate())
    task = asyncio.create_task(buffer.wait(MODEL, deadline=_past()))
    # Turn 1 runs the waiter (its timer is due on turn 2); this test resumes first on turn
    # 2, cancels, and the timer then finds the waiter already done.
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    task.cancel()
    await settle()
    assert task.cancelled()
    assert not buffer.is_waiting(MODEL)
    await buffer.close()


async def test_abandoned_waiters_do_not_pile_up() -> None:
    buffer = _buffer(RecordingActivate(), release_concurrency=1)
    tasks = _start(buffer, 40)
    await settle()
    for task in tasks[:-1]:
        task.cancel()
    await settle()
    assert buffer.waiting(MODEL) == 1
    buffer.replica_added(MODEL, Replica("a", "http://a"))
    await settle()
    assert tasks[-1].done() and not tasks[-1].cancelled()
    await buffer.close()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_grants_are_released_once() -> None:
    buffer = _buffer(RecordingActivate(), release_concurrency=1)
    tasks = _start(buffer, 3)
    await settle()
    buffer.replica_added(MODEL, Replica("a", "http://a"))
    await settle()
    grant = _granted(tasks)[0]
    grant.release()
    grant.release()
    await settle()
    assert len(_granted(tasks)) == 2
    await buffer.close()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_close_stops_activation_and_fails_waiters() -> None:
    activate = RecordingActivate(gate=asyncio.Event())
    buffer = _buffer(activate)
    tasks = _start(buffer, 2)
    await settle()
    await buffer.close()
    await asyncio.gather(*tasks, return_exceptions=True)
    await settle()
    for task in tasks:
        error = task.exception()
        assert isinstance(error, ShuttingDownError)
        assert error.retry_after_s == 3
    assert not buffer.is_waiting(MODEL)


async def test_a_waiter_leaving_after_close_touches_nothing() -> None:
    activate = RecordingActivate()
    buffer = _buffer(activate)
    tasks = _start(buffer, 1)
    await settle()  # the activation call returned: no task left to await on close
    tasks[0].cancel()
    await buffer.close()
    await asyncio.gather(*tasks, return_exceptions=True)
    await settle()
    assert tasks[0].cancelled()
    assert buffer.waiting(MODEL) == 0


# ---- first responses ----


async def test_the_first_response_of_a_burst_that_activated_is_told_once() -> None:
    activate = RecordingActivate()
    buffer = _buffer(activate, release_concurrency=2)
    started = asyncio.get_running_loop().time()
    tasks = _start(buffer, 3)
    await settle()
    await asyncio.sleep(0.05)
    buffer.replica_added(MODEL, Replica("w1", "http://w1"))
    await settle()
    first, second = _granted(tasks)
    waited_s = first.responded()
    assert waited_s is not None
    assert 0.05 <= waited_s <= asyncio.get_running_loop().time() - started
    assert second.responded() is None
    assert first.responded() is None
    first.release()
    await settle()
    assert _granted(tasks)[2].responded() is None
    await buffer.close()


async def test_no_first_response_without_an_activation() -> None:
    replicas = _Replicas()
    replica = Replica("w1", "http://w1")
    replicas.by_model[MODEL] = [replica]
    activate = RecordingActivate()
    buffer = _buffer(activate, replicas)
    # Waiting with replicas known (the model had a queue): released without activating.
    grant = await buffer.wait(MODEL, deadline=_later())
    assert activate.calls == []
    assert grant.responded() is None
    grant.release()
    await buffer.close()


async def test_an_activation_asked_again_before_any_response_keeps_the_first_time() -> None:
    activate = RecordingActivate()
    buffer = _buffer(activate, release_concurrency=1)
    tasks = _start(buffer, 2)
    await settle()
    await asyncio.sleep(0.05)
    dead = Replica("dead", "http://dead")
    buffer.replica_added(MODEL, dead)
    await settle()
    [gone] = _granted(tasks)
    # The replica vanished before the request reached it: the model is activated again.
    buffer.replica_removed(MODEL, dead)
    gone.release()
    await settle()
    assert activate.calls == [MODEL, MODEL]
    buffer.replica_added(MODEL, Replica("w2", "http://w2"))
    await settle()
    [granted] = [g for g in _granted(tasks) if g is not gone]
    waited_s = granted.responded()
    assert waited_s is not None and waited_s >= 0.05
    await buffer.close()


async def test_a_failure_for_good_reaches_every_waiter_as_it_is() -> None:
    failure = ModelFailedError(model=MODEL, reason="config.pbtxt: bad", failed_at=1.5)
    gate = asyncio.Event()
    buffer = _buffer(RecordingActivate(error=failure, gate=gate))
    tasks = _start(buffer, 3)
    await settle()
    gate.set()
    await settle()
    for task in tasks:
        error = task.exception()
        assert isinstance(error, ModelFailedError)
        assert (error.model, error.reason, error.failed_at) == (MODEL, "config.pbtxt: bad", 1.5)
    assert not buffer.is_waiting(MODEL)
    await buffer.close()


async def test_an_activation_error_that_says_when_to_retry_sets_retry_after() -> None:
    class _BackingOff(Exception):
        retry_after_s = 17

    buffer = _buffer(RecordingActivate(error=_BackingOff("backing off")))
    with pytest.raises(ActivationFailedError) as raised:
        await buffer.wait(MODEL, deadline=_later())
    assert raised.value.retry_after_s == 17
    await buffer.close()
