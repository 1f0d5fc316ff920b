"""The keys' quota counters in a real redis-server: two activators' quotas over one Redis
enforce one budget (rate, in flight, activations), and with the server stopped each
activator's local fallback still bounds its requests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from activator.errors import QuotaExceededError
from activator.gate import Gate, Pass
from activator.quotas import LocalCounters, Quotas
from control_plane.store.redis.quotas import RedisQuotaCounters
from foundation.keys import ApiKeyRecord, KeyLimits
from tests.control_plane.store.conftest import RedisServer

pytestmark = pytest.mark.anyio


def key(key_id: str, **limits: float) -> ApiKeyRecord:
    return ApiKeyRecord(id=key_id, name="k", secret_sha256="00", limits=KeyLimits(**limits))  # type: ignore[arg-type]


@pytest.fixture
async def activators(own_redis_server: RedisServer) -> AsyncIterator[list[Quotas]]:
    """Two activators' quotas, each with its own connections to the one server (timeouts
    generous, so that a slow shared machine does not look like an outage)."""
    counters = [RedisQuotaCounters(own_redis_server.url, timeout_s=2.0) for _ in range(2)]
    try:
        yield [Quotas(LocalCounters(max_keys=100), c, fallback_s=60.0) for c in counters]
    finally:
        for c in counters:
            await c.close()


async def admitted(quotas: Quotas, record: ApiKeyRecord) -> bool:
    try:
        await quotas.admit(record)
    except QuotaExceededError:
        return False
    return True


async def test_two_activators_share_one_rate_budget(activators: list[Quotas]):
    # Three requests at once, then nothing for about 17 minutes: a test of any speed sees
    # the burst only.
    record = key("aaaaaaaaaaaa", requests_per_s=0.001, burst=3)
    results = [await admitted(activators[i % 2], record) for i in range(8)]
    assert results == [True, True, True, False, False, False, False, False]
    with pytest.raises(QuotaExceededError) as refused:
        await activators[0].admit(record)
    assert refused.value.retry_after_s > 60


async def test_two_activators_share_in_flight_places_and_activations(activators: list[Quotas]):
    record = key("bbbbbbbbbbbb", max_in_flight=2, activations_per_hour=1)
    first = await activators[0].admit(record)
    second = await activators[1].admit(record)
    assert first is not None and second is not None
    assert not await admitted(activators[0], record)
    assert not await admitted(activators[1], record)
    second()
    await activators[1].close()  # the release reached Redis
    third = await activators[0].admit(record)
    assert third is not None
    await activators[0].charge_activation(record)
    with pytest.raises(QuotaExceededError) as refused:
        await activators[1].charge_activation(record)
    assert refused.value.limit == "activations_per_hour"


async def test_with_redis_stopped_each_activator_still_limits(
    activators: list[Quotas], own_redis_server: RedisServer
):
    record = key("cccccccccccc", requests_per_s=0.001, burst=2)
    own_redis_server.stop()
    # Each activator alone: its own bucket of 2, so 4 in all, never more.
    results = [await admitted(activators[i % 2], record) for i in range(10)]
    assert sum(results) == 4
    assert results[:4] == [True] * 4


async def test_requests_arriving_together_at_zero_are_charged_one_activation(
    activators: list[Quotas],
):
    # Every charge waits on Redis: without coalescing, each of these requests for a model
    # at zero would be charged before any of them reached the buffer.
    gate = Gate(None, activators[0])
    record = key("cccccccccccc", activations_per_hour=2)
    admission = Pass(record)
    started: set[str] = set()

    def would_activate(model: str) -> bool:
        return model not in started

    await asyncio.gather(*(gate.activation(admission, "m", would_activate) for _ in range(12)))
    # One charge spent: the budget of two has one left, for another model's cold start.
    await gate.activation(admission, "n", would_activate)
    with pytest.raises(QuotaExceededError):
        await gate.activation(admission, "o", would_activate)
    # A model that is up (or starting) costs nothing.
    started.add("o")
    await gate.activation(admission, "o", would_activate)


async def test_a_refused_charge_leaves_the_cold_start_to_another_key(
    activators: list[Quotas],
):
    gate = Gate(None, activators[0])
    spent = Pass(key("dddddddddddd", activations_per_hour=0))
    funded = Pass(key("eeeeeeeeeeee", activations_per_hour=1))
    results = await asyncio.gather(
        gate.activation(spent, "m", lambda model: True),
        gate.activation(funded, "m", lambda model: True),
        return_exceptions=True,
    )
    assert isinstance(results[0], QuotaExceededError) and results[1] is None
    with pytest.raises(QuotaExceededError):
        await gate.activation(funded, "n", lambda model: True)
