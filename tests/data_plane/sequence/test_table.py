"""The sequence table's decisions, as tables of steps: which slot a sequence takes, when it
waits, when it is refused, which backlogged sequence a freed slot goes to, and what the
reaper ends. Time is an argument; nothing here waits."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from data_plane.sequence import (
    SequenceBacklogFullError,
    SequenceNotStartedError,
    correlation_id_of,
)
from data_plane.sequence.table import END, START, Run, SequenceTable, Slot

IDLE_US = 1_000
SLOTS = [Slot(i, lane) for lane in (0, 1) for i in (0, 1)]


@dataclass
class Harness:
    """A table of two lanes of two slots; items are the request numbers admitted."""

    table: SequenceTable[int] = field(
        default_factory=lambda: SequenceTable("acc", SLOTS, idle_us=IDLE_US, max_backlog=2)
    )
    runs: dict[object, Run[int]] = field(default_factory=dict)
    count: int = 0

    def admit(self, cid: int | str, flags: int = 0, now: int = 0, timeout: int = 0) -> Run[int]:
        self.count += 1
        admission = self.table.admit(cid, flags, self.count, now_us=now, timeout_us=timeout)
        self.runs[cid] = admission.run
        return admission.run

    def finish(self, cid: int | str) -> Run[int] | None:
        """Run everything queued in ``cid``'s run, then release its slot if it is done."""
        run = self.runs[cid]
        run.queue.clear()
        return self.table.release(run) if run.is_done else None


def where(run: Run[int]) -> tuple[int, int] | None:
    return None if run.slot is None else (run.slot.index, run.slot.lane)


@pytest.mark.parametrize(
    ("starts", "expected"),
    [
        pytest.param(1, [(0, 0)], id="first-takes-slot-0-lane-0"),
        pytest.param(2, [(0, 0), (0, 1)], id="second-takes-slot-0-of-the-next-lane"),
        pytest.param(4, [(0, 0), (0, 1), (1, 0), (1, 1)], id="lowest-index-first"),
        pytest.param(5, [(0, 0), (0, 1), (1, 0), (1, 1), None], id="fifth-waits-in-backlog"),
    ],
)
def test_starts_take_the_lowest_free_slot(starts: int, expected: list[object]) -> None:
    h = Harness()
    assert [where(h.admit(cid, START)) for cid in range(1, starts + 1)] == expected


def test_request_without_start_and_no_sequence_is_refused_with_tritons_text() -> None:
    h = Harness()
    with pytest.raises(SequenceNotStartedError) as caught:
        h.admit(7)
    assert caught.value.message == (
        "inference request for sequence 7 to model 'acc' must specify the START flag on the "
        "first request of the sequence"
    )
    assert h.table.live == 0


@pytest.mark.parametrize(
    ("steps", "queued", "is_bound"),
    [
        pytest.param([START, 0, 0], [1, 2, 3], True, id="steps-join-the-run"),
        pytest.param([START, 0, END], [1, 2, 3], False, id="end-unbinds"),
        pytest.param([START | END], [1], False, id="start-and-end-in-one"),
        pytest.param([START, START], [1, 2], True, id="start-again-joins-the-running-run"),
    ],
)
def test_requests_of_one_sequence_queue_in_its_run(
    steps: list[int], queued: list[int], is_bound: bool
) -> None:
    h = Harness()
    runs = {id(h.admit(5, flags)) for flags in steps}
    run = h.runs[5]
    assert len(runs) == 1
    assert list(run.queue) == queued
    assert run.is_bound is is_bound
    assert h.table.live == (1 if is_bound else 0)


def test_after_end_the_id_needs_start_again_and_starts_a_new_run() -> None:
    h = Harness()
    first = h.admit(5, START | END)
    with pytest.raises(SequenceNotStartedError):
        h.admit(5)
    second = h.admit(5, START)
    assert second is not first
    assert where(second) == (0, 1)  # the first still holds its slot until released


def test_release_hands_the_slot_to_the_oldest_backlogged_sequence() -> None:
    h = Harness()
    for cid in (1, 2, 3, 4):
        h.admit(cid, START)
    waiting_a = h.admit("a", START, timeout=50)
    waiting_b = h.admit("b", START)
    h.admit(2, END)
    given = h.finish(2)
    assert given is waiting_a
    assert where(waiting_a) == (0, 1)
    assert waiting_a.expires_us == 0  # a backlog timeout no longer applies in a slot
    assert where(waiting_b) is None
    assert h.table.backlog == 1


def test_release_with_no_backlog_frees_the_slot() -> None:
    h = Harness()
    h.admit(1, START | END)
    assert h.finish(1) is None
    assert h.table.free_slots == 4


def test_release_skips_backlogged_sequences_emptied_by_the_scheduler() -> None:
    h = Harness()
    for cid in (1, 2, 3, 4):
        h.admit(cid, START)
    cancelled = h.admit("gone", START)
    h.table.end(cancelled)
    cancelled.queue.clear()
    h.admit(1, END)
    assert h.finish(1) is None
    assert h.table.free_slots == 1


@pytest.mark.parametrize(
    ("queued", "bound", "running"),
    [
        pytest.param(True, False, False, id="queued"),
        pytest.param(False, True, False, id="bound"),
        pytest.param(False, False, True, id="running"),
    ],
)
def test_only_a_done_run_releases(queued: bool, bound: bool, running: bool) -> None:
    h = Harness()
    run = h.admit(1, START | (0 if bound else END))
    if not queued:
        run.queue.clear()
    run.is_running = running
    with pytest.raises(ValueError):
        h.table.release(run)


def test_backlog_full_refuses_a_new_sequence_but_not_a_running_one() -> None:
    h = Harness()
    for cid in (1, 2, 3, 4, 5, 6):
        h.admit(cid, START)
    with pytest.raises(SequenceBacklogFullError):
        h.admit(7, START)
    assert h.admit(6).queue  # a backlogged sequence's next request still joins it


@pytest.mark.parametrize(
    ("last_seen", "now", "ended", "due"),
    [
        pytest.param([0, 0], IDLE_US - 1, [], IDLE_US, id="not-yet"),
        pytest.param([0, 0], IDLE_US, [1, 2], -1, id="exactly-idle"),
        pytest.param([0, 500], IDLE_US, [1], 500 + IDLE_US, id="one-of-two"),
        pytest.param([300, 100], 200, [], 100 + IDLE_US, id="due-is-the-earliest"),
    ],
)
def test_reaper_ends_idle_sequences_in_slots(
    last_seen: list[int], now: int, ended: list[int], due: int
) -> None:
    h = Harness()
    for cid, seen in zip((1, 2), last_seen, strict=True):
        h.admit(cid, START, now=seen)
    reaped, next_due = h.table.reap_idle(now)
    assert [run.correlation_id for run in reaped] == ended
    assert next_due == due
    for cid in ended:
        assert not h.runs[cid].is_bound
        with pytest.raises(SequenceNotStartedError):
            h.admit(cid, now=now)


def test_reaper_leaves_backlogged_sequences_until_they_have_a_slot() -> None:
    h = Harness()
    for cid in (1, 2, 3, 4):
        h.admit(cid, START, now=10 * IDLE_US)
    h.admit("late", START, now=0)
    reaped, _ = h.table.reap_idle(5 * IDLE_US)
    assert reaped == []
    assert h.runs["late"].is_bound


def test_a_request_resets_the_idle_clock() -> None:
    h = Harness()
    h.admit(1, START, now=0)
    h.admit(1, now=900)
    assert h.table.reap_idle(IDLE_US)[0] == []
    assert [r.correlation_id for r in h.table.reap_idle(900 + IDLE_US)[0]] == [1]


@pytest.mark.parametrize(
    ("timeouts", "now", "expired", "due"),
    [
        pytest.param([0], 10**9, [], -1, id="no-timeout-never-expires"),
        pytest.param([100], 99, [], 100, id="before"),
        pytest.param([100], 100, ["w"], -1, id="at-deadline"),
        pytest.param([100, 30], 40, ["w"], -1, id="earliest-request-timeout-counts"),
        pytest.param([100, 0], 50, [], 100, id="a-request-without-timeout-keeps-it"),
    ],
)
def test_backlog_timeout(timeouts: list[int], now: int, expired: list[str], due: int) -> None:
    h = Harness()
    for cid in (1, 2, 3, 4):
        h.admit(cid, START)
    for index, timeout in enumerate(timeouts):
        h.admit("w", START if index == 0 else 0, now=0, timeout=timeout)
    gone, next_due = h.table.expire_backlog(now)
    assert [run.correlation_id for run in gone] == expired
    assert next_due == due
    if expired:
        assert h.table.backlog == 0
        with pytest.raises(SequenceNotStartedError):
            h.admit("w", now=now)


def test_drain_backlog_ends_every_waiting_sequence() -> None:
    h = Harness()
    for cid in (1, 2, 3, 4, 5, 6):
        h.admit(cid, START)
    drained = h.table.drain_backlog()
    assert [run.correlation_id for run in drained] == [5, 6]
    assert h.table.live == 4


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(None, None, id="absent"),
        pytest.param(0, None, id="zero"),
        pytest.param("", None, id="empty-string"),
        pytest.param(True, None, id="bool-is-not-an-id"),
        pytest.param(1.5, None, id="float"),
        pytest.param(5, 5, id="uint"),
        pytest.param("abc", "abc", id="string"),
        pytest.param(-5, 2**64 - 5, id="negative-int64-read-as-uint64"),
        pytest.param(2**64 - 1, 2**64 - 1, id="largest"),
    ],
)
def test_correlation_id_of(value: object, expected: object) -> None:
    assert correlation_id_of(value) == expected
