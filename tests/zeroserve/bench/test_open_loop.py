"""The Poisson schedule: seeded, ordered, inside its span, at the asked rate on average."""

from __future__ import annotations

import numpy as np
import pytest

from zeroserve.bench.open_loop import poisson_schedule


def test_the_same_seed_gives_the_same_schedule():
    first = poisson_schedule(500.0, 4.0, seed=7)
    assert np.array_equal(first, poisson_schedule(500.0, 4.0, seed=7))
    assert not np.array_equal(first, poisson_schedule(500.0, 4.0, seed=8))


def test_sends_are_ordered_and_inside_the_span():
    offsets = poisson_schedule(1000.0, 2.0, seed=1)
    assert offsets.dtype == np.int64
    assert np.all(np.diff(offsets) >= 0)
    assert offsets[0] >= 0 and offsets[-1] < 2_000_000_000


@pytest.mark.parametrize("rate", [5.0, 200.0, 20_000.0])
def test_count_and_gaps_match_a_poisson_process(rate):
    span_s = 20.0
    offsets = poisson_schedule(rate, span_s, seed=3)
    expected = rate * span_s
    # Seeded, so deterministic; the bounds are 5 standard deviations of a Poisson count.
    assert abs(len(offsets) - expected) < 5 * expected**0.5
    gaps = np.diff(offsets) / 1e9
    # Exponential gaps: the standard deviation is about the mean.
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.2)


def test_a_rate_too_low_for_the_span_may_schedule_nothing():
    assert len(poisson_schedule(0.001, 0.01, seed=0)) <= 1


@pytest.mark.parametrize(("rate", "span"), [(0.0, 1.0), (10.0, 0.0), (-1.0, 1.0)])
def test_nonsense_is_refused(rate, span):
    with pytest.raises(ValueError):
        poisson_schedule(rate, span, seed=0)
