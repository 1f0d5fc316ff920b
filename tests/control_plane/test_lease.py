"""The lease: one replica acts, another takes over when it stops renewing."""

from __future__ import annotations

import pytest

from control_plane.lease import Lease
from control_plane.store.memory import MemoryStateStore
from tests.fakes import FakeClock

pytestmark = pytest.mark.anyio


async def test_one_holder_acts_and_the_other_takes_over_after_expiry():
    clock = FakeClock()
    store = MemoryStateStore(clock=clock)
    a = Lease(store, "a", ttl_s=10, renew_s=3, clock=clock)
    b = Lease(store, "b", ttl_s=10, renew_s=3, clock=clock)
    assert await a.renew()
    assert not await b.renew()
    assert a.is_acting and not b.is_acting
    clock.advance(5)
    assert await a.renew()  # renewed: still a's
    clock.advance(9)
    assert not await b.renew()
    # a stops renewing (it died); its lease expires, and it knows so itself.
    clock.advance(2)
    assert not a.is_acting
    assert await b.renew()
    assert b.is_acting
    await store.close()


async def test_release_hands_over_at_once():
    clock = FakeClock()
    store = MemoryStateStore(clock=clock)
    a = Lease(store, "a", ttl_s=10, renew_s=3, clock=clock)
    b = Lease(store, "b", ttl_s=10, renew_s=3, clock=clock)
    await a.renew()
    await a.release()
    assert not a.is_acting
    assert await b.renew()
    await store.close()


async def test_a_store_failure_keeps_the_lease_until_it_expires():
    clock = FakeClock()
    store = MemoryStateStore(clock=clock)
    a = Lease(store, "a", ttl_s=10, renew_s=3, clock=clock)
    await a.renew()
    await store.close()  # every call fails now
    clock.advance(3)
    assert not await a.renew()
    assert a.is_acting
    clock.advance(7)
    assert not a.is_acting


def test_renewal_must_be_more_frequent_than_expiry():
    with pytest.raises(ValueError, match="renewed more often"):
        Lease(MemoryStateStore(), "a", ttl_s=3, renew_s=3)
