"""Which of a stub's threads go to idle priority, and when the stub looks for them."""

from __future__ import annotations

import pytest

from foundation.proto import model_config_pb2 as mc
from runtimes.python_backend.limits import limits_for
from runtimes.python_backend.native_threads import (
    FIRST_LOOKS,
    LOOK_EVERY,
    is_time_to_look,
    to_lower,
)


@pytest.mark.parametrize(
    ("tasks", "python_threads", "lowered", "expected"),
    [
        pytest.param([10, 11, 12], {10}, set(), [11, 12], id="every-native-thread"),
        pytest.param([10, 11, 12], {10, 12}, set(), [11], id="python-threads-kept"),
        pytest.param([10, 11, 12], {10}, {11}, [12], id="once-each"),
        pytest.param([12, 10, 11, 11], {10}, set(), [11, 12], id="ordered-once"),
        pytest.param([10], {10}, set(), [], id="only-python"),
        pytest.param([], set(), set(), [], id="nothing-readable"),
    ],
)
def test_to_lower(
    tasks: list[int], python_threads: set[int], lowered: set[int], expected: list[int]
) -> None:
    assert to_lower(tasks, python_threads, lowered) == expected


@pytest.mark.parametrize(
    ("executions", "expected"),
    [
        (1, True),
        (FIRST_LOOKS, True),
        (FIRST_LOOKS + 1, False),
        (LOOK_EVERY - 1, False),
        (LOOK_EVERY, True),
        (3 * LOOK_EVERY, True),
        (3 * LOOK_EVERY + 1, False),
    ],
)
def test_is_time_to_look(executions: int, expected: bool) -> None:
    assert is_time_to_look(executions) is expected


def test_the_parameter_is_read_beside_the_limits() -> None:
    config = mc.ModelConfig()
    config.parameters["execute_timeout_s"].string_value = "60"
    config.parameters["native_threads"].string_value = " normal "

    limits = limits_for(config)

    assert (limits.execute_timeout_s, limits.native_threads) == (60.0, "normal")
    assert limits_for(mc.ModelConfig()).native_threads == "idle"
