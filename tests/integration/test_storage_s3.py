"""The node cache against a real S3-compatible server (moto_server on loopback).

Requests are counted in moto's own request log, so "a hit makes no GET" is checked on the
server's side. Faults (corruption, truncation, stalls) come from a proxy in front of it;
403 from a second moto_server that enforces authentication.
"""

from __future__ import annotations

import contextlib
import io
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from data_plane.storage import (
    CacheFullError,
    CacheSettings,
    NodeCache,
    StorageAccessDeniedError,
    StorageCorruptError,
    StorageNotAllowedError,
    StorageNotFoundError,
    StorageTimeoutError,
    StorageUri,
    create_s3_client,
    parse_storage_uri,
)
from data_plane.storage.s3 import S3Store
from runtimes.base import RuntimeOptions
from runtimes.cache.engines import EngineCache
from runtimes.onnx import OnnxRuntime
from tests.data_plane.storage.s3_server import (
    CREDENTIALS,
    REGION,
    FaultProxy,
    MotoServer,
    start_moto,
)
from tests.models import load_mlp_weights, mlp_reference, read_config, write_onnx_mlp

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

MIB = 2**20
PART = 256 * 1024


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
def proxy(moto: MotoServer) -> Iterator[FaultProxy]:
    proxy = FaultProxy(moto.port, hang_s=10.0)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()


@contextlib.asynccontextmanager
async def open_cache(
    root: Path, endpoint: str, registry: CollectorRegistry | None = None, **overrides: Any
) -> AsyncIterator[NodeCache]:
    settings = CacheSettings(
        root=root,
        **{
            "max_bytes": 256 * MIB,
            "part_size_bytes": PART,
            "concurrency": 4,
            "read_timeout_s": 5.0,
            "lock_timeout_s": 30.0,
            **overrides,
        },
    )
    cache = NodeCache(
        settings,
        registry=registry or CollectorRegistry(),
        s3_client_factory=lambda: create_s3_client(
            settings, endpoint_url=endpoint, region_name=REGION, **CREDENTIALS
        ),
    )
    try:
        yield cache
    finally:
        await cache.close()


def put_model(client: Any, bucket: str, prefix: str, files: dict[str, bytes]) -> None:
    for relative, data in files.items():
        client.put_object(Bucket=bucket, Key=f"{prefix}/{relative}", Body=data)


def model_files(size: int = 1 * MIB, seed: int = 0) -> dict[str, bytes]:
    payload = np.random.default_rng(seed).bytes(size)
    return {"config.pbtxt": b'backend: "onnxruntime"\n', "1/model.onnx": payload}


def uri(bucket: str, prefix: str) -> StorageUri:
    return parse_storage_uri(f"s3://{bucket}/{prefix}", allowed=[f"s3://{bucket}"])


def _names_under(folder: Path) -> set[str]:
    return {p.name for p in folder.rglob("*")}


async def test_miss_then_hit_makes_no_get(tmp_path: Path, moto: MotoServer, bucket: str) -> None:
    files = model_files(size=MIB + 12345)
    put_model(moto.client(), bucket, "m", files)
    registry = CollectorRegistry()
    async with open_cache(tmp_path / "cache", moto.url, registry) as cache:
        first = await cache.fetch(uri(bucket, "m"), model="m")
        gets_after_miss = moto.object_gets(bucket, "m/")
        assert gets_after_miss == 1 + 5  # config.pbtxt, then five 256 KiB ranges
        assert first.fetched_bytes == sum(len(d) for d in files.values())
        assert (first.path / "1" / "model.onnx").read_bytes() == files["1/model.onnx"]
        assert (first.path / "config.pbtxt").read_bytes() == files["config.pbtxt"]
        first.unpin()

        second = await cache.fetch(uri(bucket, "m"), model="m")
        assert second.fetched_bytes == 0
        assert second.path == first.path and second.digest == first.digest
        second.unpin()
    # Another process (here: another cache object on the same folder) hits as well.
    async with open_cache(tmp_path / "cache", moto.url) as cache:
        (await cache.fetch(uri(bucket, "m"), model="m")).unpin()
    assert moto.object_gets(bucket, "m/") == gets_after_miss
    assert registry.get_sample_value("zeroserve_cache_misses_total") == 1
    assert registry.get_sample_value("zeroserve_cache_hits_total") == 1
    assert registry.get_sample_value("zeroserve_cache_fetched_bytes_total") == first.fetched_bytes
    assert registry.get_sample_value("zeroserve_cache_fetch_duration_seconds_count") == 1
    assert (registry.get_sample_value("zeroserve_cache_size_bytes") or 0) >= first.size_bytes


async def test_multipart_object_is_verified_and_reassembled(
    tmp_path: Path, moto: MotoServer, bucket: str
) -> None:
    payload = np.random.default_rng(3).bytes(12 * MIB + 7)
    client = moto.client()
    client.upload_fileobj(io.BytesIO(payload), bucket, "big/1/model.onnx")  # 8 MiB parts
    async with open_cache(tmp_path / "cache", moto.url, part_size_bytes=3 * MIB) as cache:
        with await cache.fetch(uri(bucket, "big"), model="big") as cached:
            assert (cached.path / "1" / "model.onnx").read_bytes() == payload
            manifest = (cached.path.parent / "manifest.json").read_text()
    assert "composite crc32" in manifest  # checked against the parts' checksums


async def test_changed_object_is_fetched_again_and_unchanged_one_is_not(
    tmp_path: Path, moto: MotoServer, bucket: str
) -> None:
    client = moto.client()
    put_model(client, bucket, "m", model_files(seed=0))
    async with open_cache(tmp_path / "cache", moto.url) as cache:
        old = await cache.fetch(uri(bucket, "m"), model="m")
        old.unpin()
        config_gets = moto.object_gets(bucket, "m/config.pbtxt")
        new_weights = model_files(seed=1)["1/model.onnx"]
        client.put_object(Bucket=bucket, Key="m/1/model.onnx", Body=new_weights)

        new = await cache.fetch(uri(bucket, "m"), model="m")
        try:
            assert new.digest != old.digest and new.path != old.path
            assert new.fetched_bytes == len(new_weights)
            assert (new.path / "1" / "model.onnx").read_bytes() == new_weights
            assert moto.object_gets(bucket, "m/config.pbtxt") == config_gets
            # The unchanged file is shared with the old version, not copied.
            old_stat = (old.path / "config.pbtxt").stat()
            assert (new.path / "config.pbtxt").stat().st_ino == old_stat.st_ino
            # The old version is intact (a process may still have it loaded).
            assert (old.path / "1" / "model.onnx").read_bytes() != new_weights
        finally:
            new.unpin()


async def test_eviction_keeps_the_bound_and_never_evicts_pinned_models(
    tmp_path: Path, moto: MotoServer, bucket: str
) -> None:
    client = moto.client()
    for name in ("a", "b", "c", "d"):
        put_model(client, bucket, name, {"1/model.onnx": os.urandom(MIB)})
    put_model(client, bucket, "huge", {"1/model.onnx": os.urandom(4 * MIB)})
    registry = CollectorRegistry()
    root = tmp_path / "cache"
    bound = int(3.5 * MIB)
    engines = EngineCache(root, "onnxruntime")
    async with open_cache(root, moto.url, registry, max_bytes=bound) as cache:
        with engines.build("engine") as build:  # an unused warm engine, the oldest of all
            (build.path / "model.onnx.data").write_bytes(os.urandom(MIB))
            build.publish({}).release()
        a = await cache.fetch(uri(bucket, "a"), model="a")
        b = await cache.fetch(uri(bucket, "b"), model="b")
        a.unpin()  # a is now the least recently used unpinned model
        c = await cache.fetch(uri(bucket, "c"), model="c")
        assert engines.open("engine") is None  # evicted first: least recently used
        assert a.path.exists()
        d = await cache.fetch(uri(bucket, "d"), model="d")
        assert not a.path.exists()
        assert b.path.exists() and c.path.exists()
        assert registry.get_sample_value("zeroserve_cache_evictions_total") == 2
        assert await cache.size_bytes() <= bound

        # b, c and d are pinned: there is no room for a, and none of them is touched.
        with pytest.raises(CacheFullError, match="pinned by loaded or loading models"):
            await cache.fetch(uri(bucket, "a"), model="a")
        assert b.path.exists() and c.path.exists() and d.path.exists()
        assert list((root / "tmp").iterdir()) == []
        with pytest.raises(CacheFullError, match="more than the node cache's bound"):
            await cache.fetch(uri(bucket, "huge"), model="huge")

        d.unpin()
        with await cache.fetch(uri(bucket, "a"), model="a") as again:
            assert again.fetched_bytes == MIB
        assert not d.path.exists() and b.path.exists() and c.path.exists()
        assert registry.get_sample_value("zeroserve_cache_evictions_total") == 3
        b.unpin()
        c.unpin()


async def test_corrupted_object_is_detected_and_nothing_is_kept(
    tmp_path: Path, moto: MotoServer, bucket: str, proxy: FaultProxy
) -> None:
    put_model(moto.client(), bucket, "m", model_files())
    root = tmp_path / "cache"
    async with open_cache(root, proxy.url) as cache:
        proxy.set("corrupt")
        with pytest.raises(StorageCorruptError, match="checksum mismatch: crc32") as caught:
            await cache.fetch(uri(bucket, "m"), model="m")
        assert "m/1/model.onnx" in caught.value.message or "config.pbtxt" in caught.value.message
        assert list((root / "models").rglob("manifest.json")) == []
        assert list((root / "tmp").iterdir()) == []

        proxy.set("pass")
        with await cache.fetch(uri(bucket, "m"), model="m") as cached:
            assert (cached.path / "1" / "model.onnx").read_bytes() == model_files()["1/model.onnx"]


async def test_truncated_parts_are_retried_then_reported(
    tmp_path: Path, moto: MotoServer, bucket: str, proxy: FaultProxy
) -> None:
    put_model(moto.client(), bucket, "m", model_files())
    async with open_cache(tmp_path / "cache", proxy.url, max_attempts=3) as cache:
        proxy.set("truncate", faults=2)  # two bodies cut short: the part retries absorb them
        with await cache.fetch(uri(bucket, "m"), model="m") as cached:
            assert (cached.path / "1" / "model.onnx").read_bytes() == model_files()["1/model.onnx"]
        assert proxy.spoiled == 2

    async with open_cache(tmp_path / "other", proxy.url, max_attempts=2) as cache:
        proxy.set("truncate")
        with pytest.raises(StorageCorruptError, match="truncated in transit"):
            await cache.fetch(uri(bucket, "m"), model="m")


async def test_stalled_store_is_a_timeout(
    tmp_path: Path, moto: MotoServer, bucket: str, proxy: FaultProxy
) -> None:
    put_model(moto.client(), bucket, "m", model_files(size=100_000))
    proxy.set("hang")
    async with open_cache(
        tmp_path / "cache", proxy.url, read_timeout_s=0.3, max_attempts=1
    ) as cache:
        with pytest.raises(StorageTimeoutError, match="did not answer in time"):
            await cache.fetch(uri(bucket, "m"), model="m")
        assert list((tmp_path / "cache" / "tmp").iterdir()) == []


@pytest.mark.parametrize(
    ("prefix", "reason"),
    [
        pytest.param("missing", "no object 'missing' and no objects under 'missing/'", id="key"),
        pytest.param("empty", "no model here", id="folder-without-model"),
    ],
)
async def test_missing_model_is_a_clear_not_found(
    tmp_path: Path, moto: MotoServer, bucket: str, prefix: str, reason: str
) -> None:
    moto.client().put_object(Bucket=bucket, Key="empty/README.md", Body=b"nothing to serve")
    async with open_cache(tmp_path / "cache", moto.url) as cache:
        with pytest.raises(StorageNotFoundError, match=reason):
            await cache.fetch(uri(bucket, prefix), model="m")


async def test_missing_bucket_is_a_clear_not_found(tmp_path: Path, moto: MotoServer) -> None:
    async with open_cache(tmp_path / "cache", moto.url) as cache:
        with pytest.raises(StorageNotFoundError, match="the bucket does not exist"):
            await cache.fetch(uri("no-such-bucket", "m"), model="m")


async def test_access_denied_is_a_clear_error(tmp_path: Path) -> None:
    server = start_moto(tmp_path, env={"INITIAL_NO_AUTH_ACTION_COUNT": "0"})
    try:
        async with open_cache(tmp_path / "cache", server.url) as cache:
            with pytest.raises(StorageAccessDeniedError, match="access denied") as caught:
                await cache.fetch(uri("models", "m"), model="m")
        assert "check this node's AWS credentials" in caught.value.message
    finally:
        server.stop()


async def test_key_escaping_the_cache_folder_is_refused(
    tmp_path: Path, moto: MotoServer, bucket: str
) -> None:
    client = moto.client()
    put_model(client, bucket, "evil", {"1/model.onnx": b"x"})
    client.put_object(Bucket=bucket, Key="evil/1/../../../../outside", Body=b"gotcha")
    root = tmp_path / "cache"
    async with open_cache(root, moto.url) as cache:
        with pytest.raises(StorageNotAllowedError, match="would escape the cache folder"):
            await cache.fetch(uri(bucket, "evil"), model="evil")
        with pytest.raises(StorageNotAllowedError, match="model name"):
            await cache.fetch(uri(bucket, "evil"), model="../evil")
    assert "outside" not in _names_under(tmp_path)


async def test_single_object_is_laid_out_as_version_one(
    tmp_path: Path, moto: MotoServer, bucket: str
) -> None:
    moto.client().put_object(Bucket=bucket, Key="files/resnet.onnx", Body=b"onnx bytes")
    async with open_cache(tmp_path / "cache", moto.url) as cache:
        with await cache.fetch(uri(bucket, "files/resnet.onnx"), model="resnet") as cached:
            assert (cached.path / "1" / "model.onnx").read_bytes() == b"onnx bytes"


async def test_list_models_of_an_s3_repository(
    tmp_path: Path, moto: MotoServer, bucket: str
) -> None:
    client = moto.client()
    for name in ("alpha", "beta"):
        put_model(client, bucket, f"repo/{name}", {"1/model.onnx": b"x"})
    client.put_object(Bucket=bucket, Key="repo/README.md", Body=b"not a model")
    async with open_cache(tmp_path / "cache", moto.url) as cache:
        repository = uri(bucket, "repo")
        assert await cache.list_models(repository) == ["alpha", "beta"]
        with await cache.fetch(repository.child("beta"), model="beta") as cached:
            assert (cached.path / "1" / "model.onnx").read_bytes() == b"x"


async def test_onnx_model_second_load_reads_disk_third_skips_the_build(
    tmp_path: Path, moto: MotoServer, bucket: str
) -> None:
    model_dir = write_onnx_mlp(tmp_path / "local", "mlp", (32, 256, 128, 8))
    client = moto.client()
    for path in (model_dir / "config.pbtxt", model_dir / "1" / "model.onnx"):
        key = f"mlp/{path.relative_to(model_dir).as_posix()}"
        client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
    root = tmp_path / "cache"
    x = np.ones((2, 32), dtype=np.float32)
    expected = mlp_reference(load_mlp_weights(model_dir), x)
    hits = []
    for _ in range(2):
        async with open_cache(root, moto.url) as cache:
            with await cache.fetch(uri(bucket, "mlp"), model="mlp") as cached:
                runtime = OnnxRuntime(name="mlp", version=1, options=RuntimeOptions(root))
                await runtime.load(cached.path / "1", read_config(cached.path), "cpu")
                try:
                    out = await runtime.infer({"INPUT0": x})
                finally:
                    await runtime.unload()
                hits.append((cached.fetched_bytes == 0, runtime.engine_cache_hit))
        np.testing.assert_allclose(out["OUTPUT0"], expected, rtol=1e-4, atol=1e-5)
    assert hits == [(False, False), (True, True)]


async def test_a_download_reports_each_part_and_the_cache_how_far_it_has_come(
    tmp_path: Path, moto: MotoServer, bucket: str
) -> None:
    files = model_files(size=MIB + 12345, seed=5)
    put_model(moto.client(), bucket, "progress", files)
    settings = CacheSettings(
        root=tmp_path / "cache", max_bytes=256 * MIB, part_size_bytes=PART, concurrency=2
    )
    client = create_s3_client(settings, endpoint_url=moto.url, region_name=REGION, **CREDENTIALS)
    with ThreadPoolExecutor(max_workers=2) as executor:
        store = S3Store(client, settings, executor)
        (obj,) = [o for o in store.list_model(uri(bucket, "progress")).objects if o.size > MIB]
        seen: list[int] = []
        store.download(uri(bucket, "progress"), obj, tmp_path / "model.onnx", on_bytes=seen.append)
        store.close()
    # Five 256 KiB ranges, in order, the last one short.
    assert seen == [PART] * 4 + [obj.size - 4 * PART]
    assert (tmp_path / "model.onnx").read_bytes() == files["1/model.onnx"]

    async with open_cache(tmp_path / "cache", moto.url) as cache:
        assert cache.fetch_progress("progress") is None
        with await cache.fetch(uri(bucket, "progress"), model="progress") as cached:
            assert cached.fetched_bytes == sum(len(d) for d in files.values())
        # Only a download under way has progress: this one has ended.
        assert cache.fetch_progress("progress") is None
