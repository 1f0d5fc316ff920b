"""Sleeping replicas' weights count against the worker's host memory: one that would not fit
is unloaded instead of put to sleep."""

from __future__ import annotations

import pytest

from control_plane.placement.host_memory import sleep_room
from tests.control_plane.test_sleeping import SLEEP_S, SleepSetup

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("budget", "asleep", "replica", "fits"),
    [
        (0, [], 0, True),  # unbounded
        (0, [10**12], 10**12, True),
        (100, [], 100, True),
        (100, [40], 60, True),
        (100, [40, 10], 60, False),
        (100, [], 101, False),
        (100, [], 0, False),  # an unknown size cannot be counted
    ],
)
def test_sleep_room(budget: int, asleep: list[int], replica: int, fits: bool):
    room = sleep_room(budget=budget, asleep=asleep, replica=replica)
    assert room.fits is fits
    assert room.reason


async def test_a_replica_without_room_in_host_memory_unloads_instead_of_sleeping():
    async with SleepSetup(worker_host_memory_bytes=100) as s:
        await s.place_llm("a", memory_bytes=60)
        await s.place_llm("b", memory_bytes=60)
        await s.place_llm("c", memory_bytes=30)
        s.wall.advance(SLEEP_S + 1)
        await s.sweep()
        assert await s.placed() == set()
        asleep = await s.asleep()
        # a and b cannot both sleep on w1 (120 > 100); c fits beside either of them.
        assert len(asleep) == 2
        assert ("c", "w1") in asleep
        unloaded = {model for _, model in s.workers.unloads()}
        assert len(unloaded) == 1
        assert unloaded < {"a", "b"}
