"""Where a worker thread starts to pay for a shared-memory copy: one region read, done on
the event loop against the same read through ``asyncio.to_thread``, by size.

The infer path copies a request's inputs out of, and its outputs into, system shared
memory regions (``data_plane.handlers.shared_memory``). On the loop, a copy stops every
other request for its duration; in a thread it costs a hop (a wake-up of the thread and
one of the loop). The hop pays once the copy takes longer than the hop itself: below that,
the loop spends more on the hop than it would on the copy. This prints both times and the
hop's extra, medians over many rounds, through the server's own ``SystemRegion``.

    python -m bench.shared_memory_copy [--rounds 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

from data_plane.shared_memory.region import SHM_ROOT, SystemRegion

SIZES = (4 << 10, 64 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20, 16 << 20)


def _median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


async def measure(region: SystemRegion, size: int, rounds: int) -> dict[str, Any]:
    """Median wall time of one read of ``size`` bytes inline and through a thread, the two
    alternating round by round so that both meet the same machine."""
    inline: list[float] = []
    hopped: list[float] = []
    read: Callable[[int, int], Any] = region.read
    for _ in range(rounds):
        started = time.perf_counter()
        read(0, size)
        inline.append(time.perf_counter() - started)
        started = time.perf_counter()
        await asyncio.to_thread(read, 0, size)
        hopped.append(time.perf_counter() - started)
    return {
        "bytes": size,
        "inline_us": _median_us(inline),
        "thread_us": _median_us(hopped),
        "hop_extra_us": _median_us(hopped) - _median_us(inline),
    }


async def main(rounds: int, sizes: tuple[int, ...] = SIZES) -> list[dict[str, Any]]:
    key = f"zeroserve-bench-{uuid.uuid4().hex}"
    path = SHM_ROOT / key
    size = max(sizes)
    with path.open("wb") as created:
        created.truncate(size)
    try:
        region = SystemRegion.open(name="bench", key=f"/{key}", offset=0, byte_size=size)
        try:
            # Fewer rounds past 1 MiB: each takes long enough for a stable median.
            return [
                await measure(region, s, rounds if s <= 1 << 20 else max(rounds // 5, 1))
                for s in sizes
            ]
        finally:
            region.retire()
    finally:
        path.unlink(missing_ok=True)


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200, help="reads per size and way")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print(f"{'size':>10} {'inline us':>10} {'thread us':>10} {'hop adds us':>12}")
    for row in asyncio.run(main(args.rounds)):
        print(
            f"{row['bytes'] >> 10:>7} KiB {row['inline_us']:>10.1f} {row['thread_us']:>10.1f} "
            f"{row['hop_extra_us']:>12.1f}"
        )


if __name__ == "__main__":
    run()
