"""CustomMetrics: handles share series, series and families go with their last handle or
their owner, histograms render cumulatively (``le`` last), values as Triton writes them."""

from __future__ import annotations

import pytest

from runtimes.custom_metrics import CustomMetrics, MetricError, MetricKind, format_value


def _render(metrics: CustomMetrics) -> list[str]:
    return list(metrics.lines())


def test_two_handles_on_one_label_set_share_a_series_until_the_last_goes() -> None:
    metrics = CustomMetrics()
    owner = metrics.new_owner()
    family = metrics.create_family(owner, "seen", "Seen", MetricKind.COUNTER)
    first = metrics.create_metric(owner, family, {"b": "2", "a": "1"})
    second = metrics.create_metric(owner, family, {"a": "1", "b": "2"})
    metrics.increment(first, 2)
    metrics.increment(second, 0.5)
    assert metrics.value(second) == 2.5
    metrics.delete(first)
    assert _render(metrics) == ["# HELP seen Seen", "# TYPE seen counter", 'seen{a="1",b="2"} 2.5']
    metrics.delete(second)
    assert _render(metrics) == ["# HELP seen Seen", "# TYPE seen counter"]
    metrics.delete(family)
    assert _render(metrics) == []


def test_an_owner_going_away_takes_what_it_created_and_leaves_the_rest() -> None:
    metrics = CustomMetrics()
    mine, other = metrics.new_owner(), metrics.new_owner()
    family = metrics.create_family(mine, "g", "Gauge", MetricKind.GAUGE)
    metric = metrics.create_metric(mine, family, {})
    kept = metrics.create_family(other, "g", "Gauge", MetricKind.GAUGE)
    kept_metric = metrics.create_metric(other, kept, {"x": "y"})
    metrics.set(metric, 4)
    metrics.set(kept_metric, -1.25)
    metrics.drop_owner(mine)
    assert _render(metrics) == ["# HELP g Gauge", "# TYPE g gauge", 'g{x="y"} -1.25']
    with pytest.raises(MetricError, match="has been deleted"):
        metrics.value(metric)


def test_a_histogram_counts_each_observation_in_every_bucket_at_or_above_it() -> None:
    metrics = CustomMetrics()
    owner = metrics.new_owner()
    family = metrics.create_family(owner, "h", "Sizes", MetricKind.HISTOGRAM)
    metric = metrics.create_metric(owner, family, {"m": "a"}, [1.0, 10.0])
    for value in (1.0, 5.0, 50.0):
        metrics.observe(metric, value)
    assert _render(metrics) == [
        "# HELP h Sizes",
        "# TYPE h histogram",
        'h_count{m="a"} 3',
        'h_sum{m="a"} 56',
        'h_bucket{m="a",le="1"} 1',
        'h_bucket{m="a",le="10"} 2',
        'h_bucket{m="a",le="+Inf"} 3',
    ]


@pytest.mark.parametrize(
    ("value", "text"),
    [
        pytest.param(3.0, "3", id="integral"),
        pytest.param(0.1 + 0.2, "0.30000000000000004", id="full-precision"),
        pytest.param(float("inf"), "+Inf", id="inf"),
        pytest.param(float("-inf"), "-Inf", id="minus-inf"),
        pytest.param(float("nan"), "NaN", id="nan"),
    ],
)
def test_values_are_written_as_triton_writes_them(value: float, text: str) -> None:
    assert format_value(value) == text


def test_an_unknown_kind_and_a_family_of_another_kind_are_refused() -> None:
    metrics = CustomMetrics()
    owner = metrics.new_owner()
    metrics.create_family(owner, "f", "F", MetricKind.COUNTER)
    with pytest.raises(MetricError, match="Unknown metric kind"):
        metrics.create_family(owner, "x", "X", 7)
    with pytest.raises(MetricError, match="different type"):
        metrics.create_family(owner, "f", "F", MetricKind.GAUGE)
