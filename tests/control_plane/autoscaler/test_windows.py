from __future__ import annotations

import math

import pytest

from control_plane.autoscaler.windows import Bucket, Peak, WindowedAverage, WindowedMax


def _fill(window: WindowedAverage, samples: list[tuple[float, float]]) -> WindowedAverage:
    for now, value in samples:
        window = window.record(value, now)
    return window


@pytest.mark.parametrize(
    ("samples", "now", "expected"),
    [
        pytest.param([], 0.0, 0.0, id="empty-is-zero"),
        pytest.param([(0.0, 4.0)], 0.0, 4.0, id="one-sample"),
        pytest.param([(0.0, 2.0), (0.5, 4.0)], 0.5, 3.0, id="same-bucket-averaged"),
        pytest.param([(0.0, 2.0), (1.0, 4.0)], 1.0, 3.0, id="two-buckets"),
        # Bucket means count once each: 3 samples of 0 in bucket 0, one of 6 in bucket 1.
        pytest.param(
            [(0.0, 0.0), (0.3, 0.0), (0.6, 0.0), (1.0, 6.0)], 1.0, 3.0, id="buckets-weigh-equally"
        ),
        # A loop ticking every 2 s leaves every other bucket empty; empty is not zero.
        pytest.param([(0.0, 4.0), (2.0, 4.0), (4.0, 4.0)], 4.0, 4.0, id="gaps-are-not-zeros"),
        pytest.param([(0.0, 0.0), (1.0, 0.0)], 1.0, 0.0, id="recorded-zeros-count"),
        # Window 3 s at now=3.0 spans buckets 1, 2, 3: the sample at 0.0 is gone.
        pytest.param([(0.0, 9.0), (1.0, 3.0)], 3.0, 3.0, id="older-bucket-expired"),
        pytest.param([(0.0, 9.0)], 3.0, 0.0, id="all-expired-is-zero"),
        pytest.param([(0.0, 9.0)], 2.999, 9.0, id="just-inside-window"),
        # The whole bucket expires together: 0.9 leaves with 0.0.
        pytest.param([(0.9, 9.0)], 3.0, 0.0, id="late-in-bucket-expires-with-bucket"),
    ],
)
def test_average(samples: list[tuple[float, float]], now: float, expected: float) -> None:
    window = _fill(WindowedAverage(window_s=3.0, bucket_s=1.0), samples)
    assert window.average(now) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("window_s", "bucket_s", "recorded_at", "last_in", "first_out"),
    [
        pytest.param(60.0, 1.0, 10.0, 69.999, 70.0, id="stable-60s"),
        pytest.param(60.0, 1.0, 10.5, 69.999, 70.0, id="stable-60s-mid-bucket"),
        pytest.param(6.0, 1.0, 0.0, 5.999, 6.0, id="panic-6s"),
        pytest.param(6.0, 2.0, 1.0, 5.999, 6.0, id="2s-buckets"),
        # Non-integer windows round up to whole buckets, as Knative's do.
        pytest.param(2.5, 1.0, 0.0, 2.999, 3.0, id="window-rounds-up"),
        # Decimal buckets: 0.3 / 0.1 is 2.9999999999999996 in floats.
        pytest.param(0.3, 0.1, 0.0, 0.29, 0.3, id="decimal-buckets"),
        pytest.param(3.0, 0.1, 0.0, 2.99, 3.0, id="decimal-buckets-long-window"),
        # Knative's monotonic clock is large; the edge holds there too.
        pytest.param(60.0, 1.0, 1e6, 1e6 + 59.999, 1e6 + 60.0, id="large-clock"),
    ],
)
def test_sample_expires_exactly_at_window_edge(
    window_s: float, bucket_s: float, recorded_at: float, last_in: float, first_out: float
) -> None:
    window = WindowedAverage(window_s, bucket_s).record(5.0, recorded_at)
    assert window.average(last_in) == 5.0
    assert window.average(first_out) == 0.0
    windowed_max = WindowedMax(window_s, bucket_s).record(5.0, recorded_at)
    assert windowed_max.maximum(last_in) == 5.0
    assert windowed_max.maximum(first_out) == 0.0


def test_record_returns_new_window_and_keeps_the_old() -> None:
    empty = WindowedAverage(window_s=6.0)
    one = empty.record(3.0, 10.0)
    two = one.record(5.0, 11.0)
    assert empty.buckets == ()
    assert one.buckets == (Bucket(10.0, 3.0, 1),)
    assert two.buckets == (Bucket(10.0, 3.0, 1), Bucket(11.0, 5.0, 1))
    assert one.average(11.0) == 3.0


def test_record_stores_start_sum_and_count_per_bucket() -> None:
    window = _fill(WindowedAverage(window_s=6.0), [(3.2, 1.0), (3.7, 2.0), (4.1, 4.0)])
    assert window.buckets == (Bucket(3.0, 3.0, 2), Bucket(4.0, 4.0, 1))
    assert window.buckets[0].mean == 1.5


def test_record_prunes_to_the_window() -> None:
    window = _fill(WindowedAverage(window_s=6.0), [(float(t), 1.0) for t in range(100)])
    assert [bucket.start_s for bucket in window.buckets] == [94.0, 95.0, 96.0, 97.0, 98.0, 99.0]


def test_clock_going_backwards_adds_to_newest_bucket() -> None:
    window = _fill(WindowedAverage(window_s=6.0), [(5.0, 2.0), (3.0, 4.0)])
    assert window.buckets == (Bucket(5.0, 6.0, 2),)
    windowed_max = WindowedMax(window_s=6.0).record(2.0, 5.0).record(4.0, 3.0)
    assert windowed_max.peaks == (Peak(5.0, 4.0),)


@pytest.mark.parametrize(
    ("samples", "now", "expected"),
    [
        pytest.param([], 0.0, 0.0, id="empty-is-zero"),
        pytest.param([(0.0, 3.0), (0.5, 1.0)], 0.5, 3.0, id="same-bucket-keeps-max"),
        pytest.param([(0.0, 1.0), (0.5, 3.0)], 0.5, 3.0, id="same-bucket-raises-max"),
        pytest.param([(0.0, 5.0), (1.0, 2.0), (2.0, 1.0)], 2.0, 5.0, id="max-over-window"),
        pytest.param([(0.0, 5.0), (1.0, 2.0), (2.0, 1.0)], 3.0, 2.0, id="old-max-expired"),
    ],
)
def test_windowed_max(samples: list[tuple[float, float]], now: float, expected: float) -> None:
    window = WindowedMax(window_s=3.0)
    for at, value in samples:
        window = window.record(value, at)
    assert window.maximum(now) == expected


def test_windowed_max_prunes_to_the_window() -> None:
    window = WindowedMax(window_s=2.0)
    for t in range(10):
        window = window.record(float(t), float(t))
    assert window.peaks == (Peak(8.0, 8.0), Peak(9.0, 9.0))


@pytest.mark.parametrize("window_type", [WindowedAverage, WindowedMax])
@pytest.mark.parametrize(
    ("window_s", "bucket_s"),
    [
        pytest.param(0.0, 1.0, id="zero-window"),
        pytest.param(-1.0, 1.0, id="negative-window"),
        pytest.param(math.nan, 1.0, id="nan-window"),
        pytest.param(math.inf, 1.0, id="infinite-window"),
        pytest.param(6.0, 0.0, id="zero-bucket"),
        pytest.param(6.0, -1.0, id="negative-bucket"),
        pytest.param(6.0, math.nan, id="nan-bucket"),
    ],
)
def test_invalid_windows_are_refused(
    window_type: type[WindowedAverage] | type[WindowedMax], window_s: float, bucket_s: float
) -> None:
    with pytest.raises(ValueError, match="must be a positive number"):
        window_type(window_s, bucket_s)
