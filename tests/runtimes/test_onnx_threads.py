"""The ONNX Runtime thread policy's decision table (a pure function; no session opened)."""

from __future__ import annotations

import pytest

from runtimes.onnx.threads import (
    SMALL_MODEL_MAX_BYTES,
    ThreadPolicy,
    choose_threads,
    is_latency_bound,
    latency_threads,
    runs_on_event_loop,
)

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


@pytest.mark.parametrize(
    ("weight_bytes", "max_batch_size", "cores", "expected"),
    [
        pytest.param(10 * MIB, 32, 2, ThreadPolicy(2, True), id="light-mlp-2-cores"),
        pytest.param(10 * MIB, 8, 16, ThreadPolicy(16, True), id="light-mlp-16-cores"),
        pytest.param(10 * MIB, 1, 2, ThreadPolicy(2, True), id="batches-of-one-row"),
        pytest.param(10 * MIB, 0, 2, None, id="no-batching"),
        pytest.param(10 * MIB, 32, 1, None, id="one-core"),
        pytest.param(SMALL_MODEL_MAX_BYTES, 32, 2, None, id="large-model"),
    ],
)
def test_latency_session_table(
    weight_bytes: int, max_batch_size: int, cores: int, expected: ThreadPolicy | None
) -> None:
    chosen = latency_threads(weight_bytes=weight_bytes, max_batch_size=max_batch_size, cores=cores)
    assert chosen == expected


@pytest.mark.parametrize(
    ("was", "rows", "max_batch_size", "expected"),
    [
        # A full batch: requests pile up, the loop needs its core.
        pytest.param(True, 32, 32, False, id="full-batch-narrows"),
        pytest.param(False, 32, 32, False, id="full-batch-stays-narrow"),
        # At most a quarter of the maximum: the model waits for requests.
        pytest.param(False, 8, 32, True, id="quarter-widens"),
        pytest.param(False, 1, 32, True, id="one-row-widens"),
        pytest.param(True, 1, 32, True, id="one-row-stays-wide"),
        # In between the last choice holds, so that the switch does not flap.
        pytest.param(True, 9, 32, True, id="between-stays-wide"),
        pytest.param(False, 9, 32, False, id="between-stays-narrow"),
        pytest.param(True, 31, 32, True, id="just-under-full-stays-wide"),
        # Small maximums: one row is a quarter; the maximum is full.
        pytest.param(False, 1, 2, True, id="max-2-one-row"),
        pytest.param(True, 2, 2, False, id="max-2-full"),
        pytest.param(True, 1, 1, False, id="max-1-every-batch-full"),
    ],
)
def test_latency_bound_switch(was: bool, rows: int, max_batch_size: int, expected: bool) -> None:
    assert is_latency_bound(was=was, rows=rows, max_batch_size=max_batch_size) is expected


@pytest.mark.parametrize(
    ("rows", "has_latency_session", "instances", "expected"),
    [
        pytest.param(1, True, 1, True, id="one-row-small-model"),
        pytest.param(2, True, 1, False, id="two-rows"),
        pytest.param(1, False, 1, False, id="large-or-unbatched-model"),
        pytest.param(1, True, 2, False, id="two-instances"),
    ],
)
def test_only_a_small_models_one_row_batch_runs_on_the_event_loop(
    rows: int, has_latency_session: bool, instances: int, expected: bool
) -> None:
    chosen = runs_on_event_loop(
        rows=rows, has_latency_session=has_latency_session, instances=instances
    )
    assert chosen is expected
