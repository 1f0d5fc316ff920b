"""A separate process that fetches one model into a node cache, for multi-process tests.

    python -m tests.data_plane.storage.fetch_worker ROOT ENDPOINT URI [options]

Prints one JSON line: ``{"path", "digest", "fetched_bytes"}``. ``--barrier DIR`` writes
``DIR/ready-<pid>`` and waits for ``DIR/go`` before fetching, so that several workers start
together. ``--block-after N`` lets N object GETs through, then writes ``DIR/blocked`` and
stalls the next one forever (the test kills the process there).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from data_plane.storage import CacheSettings, NodeCache, create_s3_client, parse_storage_uri
from tests.data_plane.storage.s3_server import CREDENTIALS, REGION


class _StallingClient:
    """Delegates to a boto3 client, but stalls the (N+1)th get_object forever."""

    def __init__(self, client: Any, allowed: int, barrier: Path) -> None:
        self._client = client
        self._allowed = allowed
        self._barrier = barrier
        self._lock = threading.Lock()

    def get_object(self, **kwargs: Any) -> Any:
        with self._lock:
            self._allowed -= 1
            stall = self._allowed < 0
        if stall:
            (self._barrier / "blocked").touch()
            while True:
                time.sleep(1)
        return self._client.get_object(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root", type=Path)
    parser.add_argument("endpoint")
    parser.add_argument("uri")
    parser.add_argument("--barrier", type=Path, required=True)
    parser.add_argument("--block-after", type=int, default=None)
    parser.add_argument("--part-size", type=int, default=256 * 1024)
    parser.add_argument("--concurrency", type=int, default=2)
    args = parser.parse_args()

    settings = CacheSettings(
        root=args.root,
        max_bytes=2**30,
        part_size_bytes=args.part_size,
        concurrency=args.concurrency,
        lock_timeout_s=60.0,
    )

    def factory() -> Any:
        client = create_s3_client(
            settings, endpoint_url=args.endpoint, region_name=REGION, **CREDENTIALS
        )
        if args.block_after is None:
            return client
        return _StallingClient(client, args.block_after, args.barrier)

    (args.barrier / f"ready-{os.getpid()}").touch()
    deadline = time.monotonic() + 60
    while not (args.barrier / "go").exists():
        if time.monotonic() > deadline:
            raise SystemExit("no go signal")
        time.sleep(0.01)

    async def run() -> None:
        cache = NodeCache(settings, registry=CollectorRegistry(), s3_client_factory=factory)
        uri = parse_storage_uri(args.uri, allowed=[args.uri])
        cached = await cache.fetch(uri, model="model")
        print(
            json.dumps(
                {
                    "path": str(cached.path),
                    "digest": cached.digest,
                    "fetched_bytes": cached.fetched_bytes,
                }
            ),
            flush=True,
        )
        cached.unpin()
        await cache.close()

    asyncio.run(run())


if __name__ == "__main__":
    main()
