"""bench.perf_analyzer_compare's arithmetic: the rotation of contenders and the medians
table, on points shaped as a run records them; its refusal of a variant it cannot run."""

from __future__ import annotations

import pytest

from bench.perf_analyzer_compare import CONTENDERS, ComparePoint, main, rotated, table


def test_each_repeat_starts_with_the_next_contender() -> None:
    orders = [rotated(CONTENDERS, repeat) for repeat in range(len(CONTENDERS) + 1)]
    assert [order[0] for order in orders] == [*CONTENDERS, CONTENDERS[0]]
    assert all(sorted(order) == sorted(CONTENDERS) for order in orders)


def test_the_table_gives_medians_and_ratios_to_triton() -> None:
    points = [
        ComparePoint(
            key, "grpc", 8, repeat, rate * (1 + repeat), 1000.0 * (1 + repeat), 3000.0, 0.5
        )
        for repeat in range(3)
        for key, rate in zip(CONTENDERS, (100.0, 200.0, 300.0, 400.0), strict=True)
    ]
    text = table(points, ["http", "grpc", "grpc-shm"], [8])
    row = next(line for line in text.splitlines() if line.startswith("| grpc | 8 |"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    # Medians of rate x1, x2, x3 are each rate x2; p50 1, 2, 3 ms: 2 ms.
    assert cells[2:6] == [
        "200 (2.00 / 3.00)",
        "400 (2.00 / 3.00)",
        "600 (2.00 / 3.00)",
        "800 (2.00 / 3.00)",
    ]
    assert cells[6:] == ["0.25", "0.50", "0.75"]
    # Rows with no points are drawn empty, not mixed with another variant's.
    assert "| http | 8 |" in text
    shm = next(line for line in text.splitlines() if line.startswith("| grpc-shm | 8 |"))
    assert "(" not in shm


def test_an_unknown_variant_is_refused_before_anything_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--variants", "grpc,grpc-cuda-shm"])
    assert exited.value.code == 2
    assert "not grpc-cuda-shm" in capsys.readouterr().err
