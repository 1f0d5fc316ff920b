"""bench.python_backend_segments reads each server's Triton-format trace into spans; the
readings here are shaped as the two servers write them (Triton spreads one request over
several entries of its id and answers before COMPUTE_END; zeroserve writes one entry)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.python_backend_segments import model_by_trace, spans_us, summary, table


def _entry(trace_id: int, **stamps: int) -> dict[str, Any]:
    return {
        "id": trace_id,
        "timestamps": [{"name": name, "ns": ns} for name, ns in stamps.items()],
    }


def _triton_request(trace_id: int, start_ns: int) -> list[dict[str, Any]]:
    """One request as Triton 2.51 traces a Python-backend model: its answer goes to HTTP
    (INFER_RESPONSE_COMPLETE) before the stub's clean-up ends the compute."""
    return [
        _entry(trace_id, HTTP_RECV_START=start_ns - 50_000),
        {"id": trace_id, "model_name": "mlp_triton", "model_version": 1},
        _entry(trace_id, REQUEST_START=start_ns),
        _entry(trace_id, COMPUTE_START=start_ns + 20_000),
        _entry(trace_id, INFER_RESPONSE_COMPLETE=start_ns + 220_000),
        _entry(trace_id, COMPUTE_END=start_ns + 260_000),
        _entry(trace_id, REQUEST_END=start_ns + 263_000),
    ]


def _zeroserve_request(trace_id: int, model: str, start_ns: int) -> dict[str, Any]:
    entry = _entry(
        trace_id,
        REQUEST_START=start_ns,
        QUEUE_START=start_ns + 5_000,
        COMPUTE_START=start_ns + 30_000,
        COMPUTE_END=start_ns + 380_000,
        REQUEST_END=start_ns + 400_000,
    )
    return {**entry, "model_name": model, "model_version": 1}


def test_triton_answer_is_its_response_not_its_request_end() -> None:
    entries = [e for i in range(3) for e in _triton_request(i + 1, 1_000_000 * (i + 1))]

    spans = spans_us(entries)

    assert spans == {"queue": [20.0] * 3, "compute": [200.0] * 3, "request": [220.0] * 3}


def test_zeroserve_answer_is_its_request_end_and_models_are_told_apart() -> None:
    entries = [
        _zeroserve_request(1, "mlp_triton", 1_000_000),
        _zeroserve_request(2, "mlp_inprocess", 2_000_000),
    ]

    assert model_by_trace(entries) == {1: "mlp_triton", 2: "mlp_inprocess"}
    assert spans_us(entries[:1]) == {"queue": [30.0], "compute": [370.0], "request": [400.0]}


def test_a_request_missing_a_timestamp_is_left_out() -> None:
    partial = _entry(9, REQUEST_START=1_000, REQUEST_END=9_000)  # never computed

    assert spans_us([partial]) == {"queue": [], "compute": [], "request": []}


def test_summary_puts_what_the_trace_misses_outside() -> None:
    spans = {"queue": [20.0, 30.0, 25.0], "compute": [200.0, 210.0, 190.0], "request": [220.0]}

    # Rates 2,000 / 2,500 / 4,000 per second: the median cycle is 400 us.
    got = summary(spans, [2_000.0, 2_500.0, 4_000.0])

    assert got == {
        "cycle": 400.0,
        "queue": 25.0,
        "compute": 200.0,
        "outside": 180.0,
        "traced": 1.0,
    }
    assert "| outside the trace (HTTP, JSON, wake-ups, client) | 180 |" in table({"triton": got})


def test_nothing_traced_is_an_error_not_a_zero() -> None:
    with pytest.raises(ValueError, match="no request was traced"):
        summary({"queue": [], "compute": [], "request": []}, [1_000.0])
