"""The node cache shared by several processes: one fetch per model, and crash safety."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from data_plane.storage import CacheSettings, NodeCache, create_s3_client, parse_storage_uri
from tests.data_plane.storage.s3_server import CREDENTIALS, REGION, MotoServer, start_moto

pytestmark = [pytest.mark.integration]

PART = 256 * 1024
WAIT_S = 60.0


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    server = start_moto(tmp_path_factory.mktemp("moto"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def bucket(moto: MotoServer) -> str:
    name = f"models-{uuid.uuid4().hex[:12]}"
    moto.client().create_bucket(Bucket=name)
    return name


@pytest.fixture
def workers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=30)
            for stream in (process.stdout, process.stderr):
                if stream is not None:
                    stream.close()


def start_worker(
    started: list[subprocess.Popen[bytes]],
    root: Path,
    moto: MotoServer,
    uri: str,
    barrier: Path,
    *extra: str,
) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.data_plane.storage.fetch_worker",
            str(root),
            moto.url,
            uri,
            "--barrier",
            str(barrier),
            "--part-size",
            str(PART),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    started.append(process)
    return process


def wait_for(predicate: object, what: str) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_two_processes_loading_one_model_fetch_it_once(
    tmp_path: Path, moto: MotoServer, bucket: str, workers: list[subprocess.Popen[bytes]]
) -> None:
    payload = np.random.default_rng(0).bytes(2 * 1024 * 1024)
    moto.client().put_object(Bucket=bucket, Key="m/1/model.onnx", Body=payload)
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    uri = f"s3://{bucket}/m"
    for _ in range(2):
        start_worker(workers, tmp_path / "cache", moto, uri, barrier)
    wait_for(lambda: len(list(barrier.glob("ready-*"))) == 2, "both workers to be ready")
    (barrier / "go").touch()

    results = []
    for process in workers:
        out, err = process.communicate(timeout=WAIT_S)
        assert process.returncode == 0, err.decode()
        results.append(json.loads(out))
    assert sorted(r["fetched_bytes"] for r in results) == [0, len(payload)]
    assert results[0]["path"] == results[1]["path"]
    assert moto.object_gets(bucket, "m/") == len(payload) // PART  # one fetch, in parts
    assert (Path(results[0]["path"]) / "1" / "model.onnx").read_bytes() == payload


@pytest.mark.anyio
async def test_fetch_killed_half_way_leaves_nothing_used_and_is_retried(
    tmp_path: Path, moto: MotoServer, bucket: str, workers: list[subprocess.Popen[bytes]]
) -> None:
    payload = np.random.default_rng(1).bytes(8 * PART)
    moto.client().put_object(Bucket=bucket, Key="m/1/model.onnx", Body=payload)
    root = tmp_path / "cache"
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    uri = f"s3://{bucket}/m"
    worker = start_worker(
        workers, root, moto, uri, barrier, "--block-after", "3", "--concurrency", "1"
    )
    (barrier / "go").touch()
    wait_for(lambda: (barrier / "blocked").exists(), "the worker to stall mid-fetch")
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=WAIT_S)
    assert moto.object_gets(bucket, "m/") == 3
    # The dead fetch left a partial folder in tmp/ and no version a load would use.
    assert [p.name for p in (root / "tmp").iterdir()] != []
    assert list((root / "models").rglob("manifest.json")) == []

    settings = CacheSettings(root=root, max_bytes=2**30, part_size_bytes=PART, concurrency=2)
    cache = NodeCache(
        settings,
        registry=CollectorRegistry(),
        s3_client_factory=lambda: create_s3_client(
            settings, endpoint_url=moto.url, region_name=REGION, **CREDENTIALS
        ),
    )
    try:
        # The dead process's lock went with it: this does not wait for it.
        cached = await cache.fetch(parse_storage_uri(uri, allowed=[uri]), model="m")
        with cached:
            assert cached.fetched_bytes == len(payload)
            assert (cached.path / "1" / "model.onnx").read_bytes() == payload
    finally:
        await cache.close()
    assert moto.object_gets(bucket, "m/") == 3 + 8
    assert list((root / "tmp").iterdir()) == []  # swept
