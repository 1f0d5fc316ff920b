"""bench.shared_memory_copy: both ways of one read measured, through a real region."""

from __future__ import annotations

import pytest

from bench import shared_memory_copy

pytestmark = pytest.mark.anyio


async def test_each_size_is_read_both_ways() -> None:
    rows = await shared_memory_copy.main(rounds=3, sizes=(4096, 65536))
    assert [row["bytes"] for row in rows] == [4096, 65536]
    for row in rows:
        assert row["inline_us"] > 0
        assert row["thread_us"] > 0
        assert row["hop_extra_us"] == pytest.approx(row["thread_us"] - row["inline_us"])
