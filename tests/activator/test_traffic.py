from __future__ import annotations

import asyncio

import pytest

from activator.traffic import Traffic
from foundation.records import FirstResponse, TrafficReport
from tests.activator.fakes import FakeStore, settle
from tests.fakes import FakeClock

pytestmark = pytest.mark.anyio


def _traffic(store: FakeStore, clock: FakeClock, interval_s: float = 3600.0) -> Traffic:
    return Traffic(store, "act-1", interval_s=interval_s, clock=clock)


async def test_reports_in_flight_and_last_arrival_per_model() -> None:
    store, clock = FakeStore(), FakeClock(1000.0)
    traffic = _traffic(store, clock)
    traffic.begin("a")
    clock.advance(1)
    traffic.begin("a")
    traffic.begin("b")
    traffic.end("b")
    assert traffic.in_flight("a") == 2
    assert traffic.in_flight("b") == 0
    assert traffic.in_flight("never") == 0
    clock.advance(1)
    await traffic.flush()
    assert store.reports == [
        TrafficReport("a", "act-1", in_flight=2, last_request_at=1001.0, reported_at=1002.0),
        TrafficReport("b", "act-1", in_flight=0, last_request_at=1001.0, reported_at=1002.0),
    ]


async def test_busy_models_are_reported_every_round_and_quiet_ones_once() -> None:
    store, clock = FakeStore(), FakeClock(1000.0)
    traffic = _traffic(store, clock)
    traffic.begin("a")
    traffic.begin("b")
    traffic.end("b")
    await traffic.flush()
    await traffic.flush()  # a still in flight: again; b quiet: not again
    assert [(r.model, r.in_flight) for r in store.reports] == [("a", 1), ("b", 0), ("a", 1)]
    traffic.end("a")
    await traffic.flush()
    await traffic.flush()
    assert [(r.model, r.in_flight) for r in store.reports][3:] == [("a", 0)]
    assert traffic.in_flight("a") == 0


async def test_a_failed_report_is_retried_next_round() -> None:
    store, clock = FakeStore(), FakeClock()
    traffic = _traffic(store, clock)
    traffic.begin("a")
    traffic.end("a")
    store.report_error = ConnectionError("down")
    await traffic.flush()
    store.report_error = None
    await traffic.flush()
    assert [(r.model, r.in_flight) for r in store.reports] == [("a", 0)]


async def test_run_reports_periodically() -> None:
    store, clock = FakeStore(), FakeClock()
    traffic = _traffic(store, clock, interval_s=0)
    traffic.begin("a")
    task = asyncio.create_task(traffic.run())
    await settle()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert store.reports and store.reports[0].in_flight == 1


async def test_a_first_response_is_sent_once_in_the_next_round() -> None:
    store, clock = FakeStore(), FakeClock(1000.0)
    traffic = _traffic(store, clock)
    traffic.first_response("a", "w1", 0.25)
    clock.advance(1)
    traffic.first_response("a", "w2", 0.5)  # the first one is not sent yet: this one goes
    await traffic.flush()
    await traffic.flush()
    assert store.first_responses == [
        FirstResponse("a", "act-1", worker_id="w1", responded_at=1000.0, waited_s=0.25)
    ]
    assert store.reports == []  # no request counted: no traffic to report


async def test_a_failed_first_response_report_is_retried_next_round() -> None:
    store, clock = FakeStore(), FakeClock(1000.0)
    traffic = _traffic(store, clock)
    traffic.first_response("a", "w1", 0.25)
    store.report_error = ConnectionError("down")
    await traffic.flush()
    store.report_error = None
    await traffic.flush()
    assert [(r.model, r.worker_id) for r in store.first_responses] == [("a", "w1")]
