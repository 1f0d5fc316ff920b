from __future__ import annotations

import pytest

from activator.lb import Replica, choose


def _replicas(*in_flight: int) -> list[Replica]:
    return [Replica(f"w{i}", f"http://w{i}", n) for i, n in enumerate(in_flight)]


@pytest.mark.parametrize(
    ("in_flight", "offset", "expected"),
    [
        pytest.param((), 0, None, id="no-replica"),
        pytest.param((3,), 0, 0, id="single"),
        pytest.param((3,), 7, 0, id="single-any-offset"),
        pytest.param((2, 0, 1), 0, 1, id="fewest-wins"),
        pytest.param((0, 2, 1), 1, 0, id="fewest-wins-after-wrap"),
        pytest.param((1, 1, 1), 0, 0, id="tie-first-at-offset-0"),
        pytest.param((1, 1, 1), 2, 2, id="tie-first-at-offset-2"),
        pytest.param((1, 1, 1), 4, 1, id="tie-offset-wraps"),
        pytest.param((1, 0, 0), 0, 1, id="tie-among-fewest-takes-first-after-offset"),
        pytest.param((1, 0, 0), 2, 2, id="tie-among-fewest-from-offset"),
        pytest.param((5, 4, 4, 9), 3, 1, id="larger-holds-no-advantage"),
    ],
)
def test_choose(in_flight: tuple[int, ...], offset: int, expected: int | None) -> None:
    replicas = _replicas(*in_flight)
    chosen = choose(replicas, offset=offset)
    assert chosen is (None if expected is None else replicas[expected])


def test_choose_default_offset_is_the_first() -> None:
    replicas = _replicas(0, 0)
    assert choose(replicas) is replicas[0]


def test_advancing_the_offset_spreads_an_idle_model() -> None:
    replicas = _replicas(0, 0, 0)
    assert [choose(replicas, offset=i) for i in range(6)] == replicas + replicas


def test_replicas_compare_by_identity() -> None:
    a, b = Replica("w", "http://w"), Replica("w", "http://w")
    assert a != b
    assert len({a, b}) == 2
