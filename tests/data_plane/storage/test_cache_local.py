"""Local sources (file:// and plain paths): used in place, checked against allowed roots."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

import data_plane.storage as storage
from data_plane.storage import (
    CacheSettings,
    NodeCache,
    StorageNotAllowedError,
    StorageNotFoundError,
    parse_storage_uri,
)
from runtimes.cache.layout import CacheLayout
from runtimes.cache.pins import Pin

pytestmark = pytest.mark.anyio


@pytest.fixture
def cache(tmp_path: Path) -> NodeCache:
    return NodeCache(
        CacheSettings(root=tmp_path / "cache", max_bytes=2**20), registry=CollectorRegistry()
    )


def _model(folder: Path, payload: bytes = b"weights") -> Path:
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.onnx").write_bytes(payload)
    (folder / "config.pbtxt").write_text('backend: "onnxruntime"\n')
    return folder


async def test_a_local_folder_is_used_in_place(tmp_path: Path, cache: NodeCache) -> None:
    folder = _model(tmp_path / "repo" / "m")
    uri = parse_storage_uri(str(folder), allowed=[str(tmp_path / "repo")])
    with await cache.fetch(uri, model="m") as cached:
        assert cached.path == folder.resolve()
        assert cached.fetched_bytes == 0 and not cached.is_pinned
        first = cached.digest
    assert (await cache.fetch(uri, model="m")).digest == first
    (folder / "1" / "model.onnx").write_bytes(b"other weights")
    assert (await cache.fetch(uri, model="m")).digest != first
    await cache.close()


async def test_a_local_file_is_laid_out_as_version_one(tmp_path: Path, cache: NodeCache) -> None:
    source = tmp_path / "files" / "net.onnx"
    source.parent.mkdir()
    source.write_bytes(b"onnx")
    uri = parse_storage_uri(f"file://{source}", allowed=[f"file://{tmp_path / 'files'}"])
    for _ in range(2):  # the second call reuses the layout
        cached = await cache.fetch(uri, model="net")
        assert (cached.path / "1" / "model.onnx").read_bytes() == b"onnx"
        assert cached.path.is_relative_to(tmp_path / "cache")
    await cache.close()


async def test_symlink_out_of_the_allowed_root_is_refused(tmp_path: Path, cache: NodeCache) -> None:
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"not yours")
    folder = _model(tmp_path / "repo" / "m")
    (folder / "1" / "extra.bin").symlink_to(secret)
    (tmp_path / "repo" / "link").symlink_to(tmp_path)
    allowed = [str(tmp_path / "repo")]
    with pytest.raises(StorageNotAllowedError, match="outside the allowed root"):
        await cache.fetch(parse_storage_uri(str(folder), allowed=allowed), model="m")
    with pytest.raises(StorageNotAllowedError, match="outside the allowed root"):
        await cache.fetch(
            parse_storage_uri(str(tmp_path / "repo" / "link"), allowed=allowed), model="m"
        )
    await cache.close()


@pytest.mark.parametrize("filled", [True, False], ids=["with-files", "empty"])
async def test_a_version_folder_linked_out_of_the_allowed_root_is_refused(
    tmp_path: Path, cache: NodeCache, filled: bool
) -> None:
    outside = tmp_path / "outside" / "1"
    outside.mkdir(parents=True)
    if filled:
        (outside / "model.py").write_text("print('not yours')")
    folder = _model(tmp_path / "repo" / "m")
    # An empty one too: it can be filled between this check and the load.
    (folder / "2").symlink_to(outside, target_is_directory=True)
    uri = parse_storage_uri(str(folder), allowed=[str(tmp_path / "repo")])
    with pytest.raises(StorageNotAllowedError, match=r"outside/1 \(symlinks resolved\) is outside"):
        await cache.fetch(uri, model="m")
    await cache.close()


async def test_links_inside_the_allowed_root_are_followed_once(
    tmp_path: Path, cache: NodeCache
) -> None:
    folder = _model(tmp_path / "repo" / "m")
    (folder / "2").symlink_to(folder / "1", target_is_directory=True)
    (folder / "1" / "up").symlink_to(folder, target_is_directory=True)  # a cycle
    uri = parse_storage_uri(str(folder), allowed=[str(tmp_path / "repo")])
    with await cache.fetch(uri, model="m") as cached:
        assert cached.path == folder.resolve()
        first = cached.digest
    # A file reached only through a linked folder counts: changing it changes the digest.
    shared = tmp_path / "repo" / "shared"
    shared.mkdir()
    (shared / "weights.bin").write_bytes(b"a")
    (folder / "1" / "data").symlink_to(shared, target_is_directory=True)
    second = (await cache.fetch(uri, model="m")).digest
    (shared / "weights.bin").write_bytes(b"bb")
    assert len({first, second, (await cache.fetch(uri, model="m")).digest}) == 3
    await cache.close()


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        pytest.param(lambda p: None, "no such file or folder", id="missing"),
        pytest.param(lambda p: p.mkdir(), "no model here", id="empty-folder"),
        pytest.param(
            lambda p: (p.mkdir(), (p / "model.onnx").write_bytes(b"x")),
            "no model here",
            id="no-version-folder",
        ),
    ],
)
async def test_no_model_is_a_clear_error(
    tmp_path: Path, cache: NodeCache, make: object, reason: str
) -> None:
    folder = tmp_path / "m"
    assert callable(make)
    make(folder)
    with pytest.raises(StorageNotFoundError, match=reason):
        await cache.fetch(parse_storage_uri(str(folder), allowed=[str(tmp_path)]), model="m")
    await cache.close()


async def test_list_models_of_a_local_repository(tmp_path: Path, cache: NodeCache) -> None:
    for name in ("b", "a", ".hidden"):
        _model(tmp_path / "repo" / name)
    (tmp_path / "repo" / "README.md").write_text("x")
    uri = parse_storage_uri(str(tmp_path / "repo"), allowed=[str(tmp_path)])
    assert await cache.list_models(uri) == ["a", "b"]
    await cache.close()


def test_sweep_removes_what_dead_fetches_left_and_keeps_live_ones(tmp_path: Path) -> None:
    layout = CacheLayout(tmp_path)
    layout.ensure()
    dead = layout.new_tmp_dir("dead", 10)
    (dead / ".pin").touch()  # its owner is gone: nobody holds the lock
    live = layout.new_tmp_dir("live", 10)
    pin = Pin.acquire(live, timeout_s=1, create=True)
    newborn = layout.new_tmp_dir("newborn", 10)  # no pin yet, but young
    old = layout.new_tmp_dir("old", 10)
    os.utime(old, (0, 0))
    layout.sweep_tmp()
    assert sorted(p.name for p in layout.tmp.iterdir()) == sorted([live.name, newborn.name])
    pin.release()


def test_exported_names() -> None:
    assert sorted(storage.__all__) == storage.__all__
    for name in storage.__all__:
        assert hasattr(storage, name)
