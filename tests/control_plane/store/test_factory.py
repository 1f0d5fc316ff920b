"""``open_state_store``: which URL gives which store, and what it refuses."""

from __future__ import annotations

import asyncio

import pytest

from bench.server import free_port
from control_plane.store.errors import StoreUnavailableError
from control_plane.store.factory import open_state_store
from control_plane.store.memory import MemoryStateStore
from control_plane.store.redis import RedisStateStore


@pytest.mark.parametrize("url", ["memory", "memory://"])
@pytest.mark.anyio
async def test_memory(url: str):
    store = open_state_store(url)
    assert isinstance(store, MemoryStateStore)
    await store.close()


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/0", "rediss://cache.example:6380/1"])
@pytest.mark.anyio
async def test_redis_opens_without_connecting(url: str):
    store = open_state_store(url, timeout_s=1.0)
    assert isinstance(store, RedisStateStore)
    await store.close()


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("", id="empty"),
        pytest.param("Memory", id="case"),
        pytest.param("redis", id="no-scheme"),
        pytest.param("postgres://admin:s3cret@db:5432/zs", id="other-scheme"),
        pytest.param("memcached://:s3cret@cache:11211", id="other-with-password"),
    ],
)
def test_anything_else_is_refused_without_echoing_secrets(url: str):
    with pytest.raises(ValueError, match="unsupported state store URL") as caught:
        open_state_store(url)
    assert "s3cret" not in str(caught.value)


@pytest.mark.anyio
async def test_an_unreachable_redis_is_reported_without_its_password():
    # Nothing listens on a just-freed loopback port: the connection is refused at once.
    store = open_state_store(f"redis://:s3cret@127.0.0.1:{free_port()}/0", timeout_s=5.0)
    try:
        with pytest.raises(StoreUnavailableError) as caught:
            async with asyncio.timeout(30.0):
                await store.list_models()
        assert caught.value.operation == "list_models"
        assert "s3cret" not in str(caught.value)
        assert ":***@127.0.0.1" in str(caught.value)
    finally:
        await store.close()
