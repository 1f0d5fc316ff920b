"""What API keys and quotas cost the activator per request, measured in process.

The end-to-end comparison (``bench/activator.py --keys``) judges latency through two real
platforms, where a shared machine's noise is milliseconds; the keys' own work is
microseconds. This measures that work alone, on this thread's CPU clock: the activator's
pure-ASGI key middleware (``activator.auth.KeyAuth``: the header scan, the key's lookup in
the cache, its SHA-256 check, the rate and in-flight limits, the scope check the routes make,
and the in-flight release) around an app that does nothing, with keys on and a key whose
every limit is set, against the same middleware with keys off. Run alone it prints the
figures::

    python bench/gate_cost.py
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any, Final

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from activator.auth import KeyAuth, admitted
from activator.gate import Gate
from activator.keys import KeyRing
from activator.quotas import LocalCounters, Quotas
from control_plane.keys import KeyService
from control_plane.store.memory import MemoryStateStore
from foundation.keys import KeyLimits

MODEL: Final = "demo_mlp"
LIMITS: Final = KeyLimits(
    requests_per_s=1_000_000, burst=1_000_000, max_in_flight=100_000, activations_per_hour=1_000
)


async def _per_request_us(
    middleware: KeyAuth, gate: Gate, header: bytes, *, requests: int, rounds: int
) -> float:
    """Median over ``rounds`` of this thread's CPU per request, in microseconds."""

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        return None

    headers = [(b"content-type", b"application/octet-stream"), (b"authorization", header)]
    results = []
    for _ in range(rounds):
        started = time.thread_time()
        for _ in range(requests):
            scope = {
                "type": "http",
                "path": f"/v2/models/{MODEL}/infer",
                "headers": headers,
                "state": {},
            }
            await middleware(scope, receive, send)
        results.append((time.thread_time() - started) / requests * 1e6)
    return statistics.median(results)


async def _measure(requests: int, rounds: int) -> dict[str, float]:
    store = MemoryStateStore()
    token, _ = await KeyService(store).create("bench", models=(MODEL,), limits=LIMITS)
    header = f"Bearer {token}".encode()
    ring = KeyRing(store, ttl_s=3600.0, max_entries=10_000, retry_after_s=1)
    figures: dict[str, float] = {}
    for name, gate in (
        ("keys_off_us", Gate(None, Quotas(LocalCounters(max_keys=10_000)))),
        ("keys_on_us", Gate(ring, Quotas(LocalCounters(max_keys=10_000)))),
    ):

        async def app(scope: Any, receive: Any, send: Any, gate: Gate = gate) -> None:
            # What the routes add: the scope check against the request's model.
            gate.authorize(admitted(scope), MODEL)

        middleware = KeyAuth(app, gate=gate)
        # Warm: the key's one store lookup, and the interpreter's caches.
        await _per_request_us(middleware, gate, header, requests=requests // 10, rounds=1)
        figures[name] = await _per_request_us(
            middleware, gate, header, requests=requests, rounds=rounds
        )
    figures["added_us"] = figures["keys_on_us"] - figures["keys_off_us"]
    await store.close()
    return figures


def measure(requests: int = 20_000, rounds: int = 5) -> dict[str, float]:
    """CPU microseconds per request with keys off and on, and the difference."""
    return asyncio.run(_measure(requests, rounds))


def text(figures: dict[str, float]) -> str:
    return (
        "in process, this thread's CPU per request through the key middleware (median of "
        f"rounds): keys off {figures['keys_off_us']:.2f} us, keys and every limit on "
        f"{figures['keys_on_us']:.2f} us: keys add {figures['added_us']:.2f} us "
        f"({figures['added_us'] / 1000:.4f} ms)"
    )


if __name__ == "__main__":
    print(text(measure()))
