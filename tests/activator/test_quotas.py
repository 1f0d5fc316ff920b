"""Quotas: the pure token bucket and window, the local counters, and the fallback from
shared counters that fail."""

from __future__ import annotations

from collections import deque

import pytest

from activator.errors import QuotaExceededError
from activator.quotas import Bucket, LocalCounters, Quotas, count_in_window, take_token
from foundation.keys import ApiKeyRecord, KeyLimits
from tests.fakes import FakeClock

pytestmark = pytest.mark.anyio


def key(**limits: float) -> ApiKeyRecord:
    return ApiKeyRecord(id="0123456789ab", name="k", secret_sha256="00", limits=KeyLimits(**limits))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bucket, now, expected_wait, expected_tokens",
    [
        pytest.param(None, 0.0, 0.0, 2.0, id="new-bucket-starts-full"),
        pytest.param(Bucket(1.0, 0.0), 0.0, 0.0, 0.0, id="takes-the-last"),
        pytest.param(Bucket(0.0, 0.0), 0.0, 0.5, 0.0, id="empty-waits-a-token"),
        pytest.param(Bucket(0.0, 0.0), 0.25, 0.25, 0.5, id="half-refilled"),
        pytest.param(Bucket(0.0, 0.0), 100.0, 0.0, 2.0, id="refill-capped-at-size"),
    ],
)
def test_take_token(
    bucket: Bucket | None, now: float, expected_wait: float, expected_tokens: float
):
    wait, after = take_token(bucket, rate=2.0, size=3, now=now)
    assert wait == pytest.approx(expected_wait)
    assert after.tokens == pytest.approx(expected_tokens) and after.at == now


def test_count_in_window():
    times: deque[float] = deque()
    assert count_in_window(times, limit=2, window_s=10.0, now=0.0) == 0.0
    assert count_in_window(times, limit=2, window_s=10.0, now=1.0) == 0.0
    assert count_in_window(times, limit=2, window_s=10.0, now=2.0) == pytest.approx(8.0)
    assert count_in_window(times, limit=2, window_s=10.0, now=10.5) == 0.0
    assert list(times) == [1.0, 10.5]
    assert count_in_window(deque(), limit=0, window_s=10.0, now=0.0) == 10.0


async def test_rate_burst_and_refill_locally():
    clock = FakeClock()
    quotas = Quotas(LocalCounters(max_keys=10, clock=clock), clock=clock)
    limited = key(requests_per_s=1.0, burst=2)
    assert await quotas.admit(limited) is None
    assert await quotas.admit(limited) is None
    with pytest.raises(QuotaExceededError) as refused:
        await quotas.admit(limited)
    assert refused.value.limit == "requests_per_s" and refused.value.retry_after_s == 1
    clock.advance(1.0)
    assert await quotas.admit(limited) is None


async def test_in_flight_is_held_until_released():
    quotas = Quotas(LocalCounters(max_keys=10))
    limited = key(max_in_flight=2)
    first, second = await quotas.admit(limited), await quotas.admit(limited)
    assert first is not None and second is not None
    with pytest.raises(QuotaExceededError) as refused:
        await quotas.admit(limited)
    assert refused.value.limit == "max_in_flight"
    first()
    third = await quotas.admit(limited)
    assert third is not None


async def test_activations_per_hour():
    clock = FakeClock()
    quotas = Quotas(LocalCounters(max_keys=10, clock=clock), clock=clock)
    limited = key(activations_per_hour=1)
    await quotas.charge_activation(limited)
    with pytest.raises(QuotaExceededError) as refused:
        await quotas.charge_activation(limited)
    assert refused.value.limit == "activations_per_hour"
    assert refused.value.retry_after_s == 3600
    clock.advance(3600.0)
    await quotas.charge_activation(limited)
    await quotas.charge_activation(key())  # no limit, never refused


class BrokenCounters:
    """Shared counters whose store is down."""

    def __init__(self) -> None:
        self.calls = 0

    async def admit(self, key_id, limits, ticket, lease_s):
        self.calls += 1
        raise ConnectionError("redis is down")

    async def release(self, key_id, ticket):
        raise ConnectionError("redis is down")

    async def count_activation(self, key_id, limit, window_s):
        self.calls += 1
        raise ConnectionError("redis is down")


async def test_a_failing_shared_store_falls_back_to_local_limits_for_a_while():
    clock = FakeClock()
    broken = BrokenCounters()
    quotas = Quotas(LocalCounters(max_keys=10, clock=clock), broken, fallback_s=5.0, clock=clock)
    limited = key(requests_per_s=0.01, burst=1, activations_per_hour=1)
    assert await quotas.admit(limited) is None
    with pytest.raises(QuotaExceededError):
        await quotas.admit(limited)
    await quotas.charge_activation(limited)
    with pytest.raises(QuotaExceededError):
        await quotas.charge_activation(limited)
    assert broken.calls == 1  # only the first; then local counters for fallback_s
    clock.advance(5.0)
    with pytest.raises(QuotaExceededError):
        await quotas.admit(limited)
    assert broken.calls == 2  # tried again, failed again, still limited
