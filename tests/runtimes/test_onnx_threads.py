"""The ONNX Runtime thread policy's decision table (a pure function; no session opened)."""

from __future__ import annotations

import pytest

from runtimes.onnx.threads import SMALL_MODEL_MAX_BYTES, ThreadPolicy, choose_threads

MIB = 2**20


@pytest.mark.parametrize(
    ("weight_bytes", "instances", "cores", "expected"),
    [
        # Small models: one thread, no pool, at any instance count or core count.
        pytest.param(10 * MIB, 1, 2, ThreadPolicy(1, False), id="light-mlp-2-cores"),
        pytest.param(10 * MIB, 2, 2, ThreadPolicy(1, False), id="light-mlp-2-instances"),
        pytest.param(10 * MIB, 1, 16, ThreadPolicy(1, False), id="light-mlp-16-cores"),
        pytest.param(SMALL_MODEL_MAX_BYTES - 1, 1, 8, ThreadPolicy(1, False), id="just-small"),
        # Large models: the cores shared among instances, spinning where there is a pool.
        pytest.param(SMALL_MODEL_MAX_BYTES, 1, 2, ThreadPolicy(2, True), id="just-large"),
        pytest.param(168 * MIB, 1, 2, ThreadPolicy(2, True), id="heavy-mlp-2-cores"),
        pytest.param(168 * MIB, 2, 2, ThreadPolicy(1, False), id="heavy-2-instances-2-cores"),
        pytest.param(168 * MIB, 2, 16, ThreadPolicy(8, True), id="heavy-2-instances-16-cores"),
        pytest.param(168 * MIB, 3, 16, ThreadPolicy(5, True), id="heavy-3-instances-16-cores"),
        pytest.param(168 * MIB, 4, 2, ThreadPolicy(1, False), id="more-instances-than-cores"),
        pytest.param(168 * MIB, 1, 1, ThreadPolicy(1, False), id="one-core"),
    ],
)
def test_decision_table(
    weight_bytes: int, instances: int, cores: int, expected: ThreadPolicy
) -> None:
    assert choose_threads(weight_bytes=weight_bytes, instances=instances, cores=cores) == expected
