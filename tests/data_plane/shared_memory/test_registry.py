"""The system shared-memory registry on real objects in /dev/shm: registration, status,
unregistration, the keys it refuses, bounds, and regions outliving their registration
while a request uses them."""

from __future__ import annotations

import os

import numpy as np
import pytest

from data_plane.errors import InvalidArgumentError
from data_plane.shared_memory import (
    CudaSharedMemory,
    RegionBoundsError,
    RegionExistsError,
    RegionLimitError,
    RegionNotFoundError,
    RegionOpenError,
    RegionStatus,
    SystemSharedMemory,
    object_name,
)
from tests.data_plane.shared_memory.objects import shm_entry, shm_object, unique_name


@pytest.fixture
def registry():
    registry = SystemSharedMemory()
    try:
        yield registry
    finally:
        registry.close()


def test_register_status_unregister(registry: SystemSharedMemory) -> None:
    with shm_object(128) as (key_a, _), shm_object(64) as (key_b, _):
        registry.register("b", key_b, 0, 64)
        registry.register("a", key_a, 64, 64)
        assert registry.status() == [
            RegionStatus("a", key_a, 64, 64),
            RegionStatus("b", key_b, 0, 64),
        ]
        assert registry.status("b") == [RegionStatus("b", key_b, 0, 64)]
        registry.unregister("a")
        assert [r.name for r in registry.status()] == ["b"]
        registry.unregister("never-registered")  # no error, as in Triton
        registry.unregister()
        assert registry.status() == []


def test_unknown_region(registry: SystemSharedMemory) -> None:
    with pytest.raises(RegionNotFoundError) as status:
        registry.status("nope")
    assert status.value.message == "Unable to find system shared memory region: 'nope'"
    with pytest.raises(RegionNotFoundError) as infer:
        registry.acquire("nope")
    assert infer.value.message == "Unable to find shared memory region: 'nope'"


def test_a_name_registers_once(registry: SystemSharedMemory) -> None:
    with shm_object(64) as (key, _):
        registry.register("r", key, 0, 64)
        with pytest.raises(RegionExistsError) as info:
            registry.register("r", key, 0, 32)
        assert info.value.message == "shared memory region 'r' already in manager"
        assert registry.status("r") == [RegionStatus("r", key, 0, 64)]


def test_one_key_under_several_names(registry: SystemSharedMemory) -> None:
    # Triton 2.51 refuses the second (it reuses a descriptor it closed); we need not.
    with shm_object(128) as (key, handle):
        handle[:4] = b"abcd"
        registry.register("first", key, 0, 64)
        registry.register("second", key, 64, 64)
        region = registry.acquire("first")
        try:
            assert region.read(0, 4).tobytes() == b"abcd"
        finally:
            region.release()


@pytest.mark.parametrize("form", ["{}", "/{}", "//{}"])
def test_key_forms_shm_open_accepts(registry: SystemSharedMemory, form: str) -> None:
    with shm_object(16) as (key, handle):
        handle[:3] = b"xyz"
        registry.register("r", form.format(key.lstrip("/")), 0, 16)
        region = registry.acquire("r")
        try:
            assert region.read(0, 3).tobytes() == b"xyz"
        finally:
            region.release()


@pytest.mark.parametrize(
    "key",
    [
        "",
        "/",
        "/.",
        "/..",
        "/../etc/passwd",
        "/../../etc/passwd",
        "/a/../b",
        "/x\0y",
        "/" + "n" * 256,
    ],
)
def test_keys_naming_no_object_directly_under_dev_shm(
    registry: SystemSharedMemory, key: str
) -> None:
    with pytest.raises(RegionOpenError) as info:
        registry.register("r", key, 0, 1)
    assert info.value.message == f"Unable to open shared memory region: '{key}'"
    assert registry.status() == []


def test_missing_object(registry: SystemSharedMemory) -> None:
    key = "/" + unique_name()
    with pytest.raises(RegionOpenError) as info:
        registry.register("r", key, 0, 1)
    assert info.value.message == f"Unable to open shared memory region: '{key}'"


@pytest.mark.parametrize("target", ["/etc/passwd", "shm-object"])
def test_links_are_not_followed(registry: SystemSharedMemory, target: str) -> None:
    # Not even to another object in /dev/shm: a link could be swapped for one leading out.
    with shm_object(64) as (object_key, _):
        link_target = f"/dev/shm{object_key}" if target == "shm-object" else target
        with shm_entry("link", link_target) as key, pytest.raises(RegionOpenError):
            registry.register("r", key, 0, 1)


def test_a_folder_or_a_file_inside_one_is_refused(registry: SystemSharedMemory) -> None:
    with shm_entry("dir") as key:
        with pytest.raises(RegionOpenError):
            registry.register("r", key, 0, 1)
        with pytest.raises(RegionOpenError):
            registry.register("r", f"{key}/inner", 0, 1)


def test_a_fifo_is_refused_without_waiting(registry: SystemSharedMemory) -> None:
    # It opens (O_NONBLOCK: no writer needed) but holds no bytes: Triton's "invalid args".
    with shm_entry("fifo") as key, pytest.raises(RegionBoundsError) as info:
        registry.register("r", key, 0, 1)
    assert info.value.message == "failed to register shared memory region 'r': invalid args"


@pytest.mark.parametrize(
    ("offset", "byte_size"),
    [(0, 129), (200, 8), (64, 65), (0, 2**64 - 1), (2**64 - 1, 1)],
    ids=["too-large", "offset-past-end", "window-past-end", "uint64-max-size", "uint64-max-offset"],
)
def test_windows_past_the_object(registry: SystemSharedMemory, offset: int, byte_size: int) -> None:
    with shm_object(128) as (key, _):
        with pytest.raises(RegionBoundsError) as info:
            registry.register("r", key, offset, byte_size)
        assert info.value.message == "failed to register shared memory region 'r': invalid args"
        assert registry.status() == []


@pytest.mark.parametrize("offset", [0, 128])
def test_an_empty_window_is_refused(registry: SystemSharedMemory, offset: int) -> None:
    with shm_object(128) as (key, _), pytest.raises(RegionBoundsError) as info:
        registry.register("r", key, offset, 0)
    assert info.value.message.startswith("failed to register shared memory region 'r': ")


def test_the_number_of_regions_is_bounded() -> None:
    registry = SystemSharedMemory(max_regions=2)
    try:
        with shm_object(64) as (key, _):
            registry.register("a", key, 0, 8)
            registry.register("b", key, 8, 8)
            with pytest.raises(RegionLimitError):
                registry.register("c", key, 16, 8)
            registry.unregister("a")
            registry.register("c", key, 16, 8)
    finally:
        registry.close()


def test_reads_and_writes_stay_in_the_window(registry: SystemSharedMemory) -> None:
    # An offset that is not a page multiple: Triton 2.51 cannot map it, we read it.
    with shm_object(256) as (key, handle):
        handle[:256] = bytes(range(256))
        registry.register("r", key, 100, 50)
        region = registry.acquire("r")
        try:
            assert region.read(0, 4).tobytes() == bytes([100, 101, 102, 103])
            region.write(46, np.array([1, 2], dtype="<u2"))
            assert bytes(handle[146:150]) == b"\x01\x00\x02\x00"
            assert bytes(handle[150:151]) == b"\x96"  # untouched past the window
            for offset, size in [(49, 2), (51, 0), (-1, 1)]:
                with pytest.raises(RegionBoundsError):
                    region.read(offset, size)
            with pytest.raises(RegionBoundsError):
                region.write(48, b"abc")
        finally:
            region.release()


@pytest.mark.parametrize(
    ("offset", "byte_size", "message"),
    [
        (64, 1, "Invalid offset for shared memory region: 'r'"),
        (200, 1, "Invalid offset for shared memory region: 'r'"),
        (60, 8, "Invalid offset + byte size for shared memory region: 'r'"),
        (0, 0, "Invalid offset + byte size for shared memory region: 'r'"),
        (0, 65, "Invalid offset + byte size for shared memory region: 'r'"),
    ],
)
def test_tensor_places_outside_the_region(
    registry: SystemSharedMemory, offset: int, byte_size: int, message: str
) -> None:
    # Registered 64 bytes into a 4096-byte object: the window, not the object, bounds the
    # places (Triton 2.51 lets a place run past a window registered at an offset).
    with shm_object(4096) as (key, _):
        registry.register("r", key, 4000, 64)
        region = registry.acquire("r")
        try:
            with pytest.raises(RegionBoundsError) as info:
                region.check_window(offset, byte_size)
            assert info.value.message == message
            region.check_window(63, 1)
        finally:
            region.release()


def test_a_region_in_use_is_closed_after_its_last_request(
    registry: SystemSharedMemory,
) -> None:
    with shm_object(64) as (key, handle):
        handle[:2] = b"ok"
        registry.register("r", key, 0, 64)
        first = registry.acquire("r")
        second = registry.acquire("r")
        registry.unregister("r")
        assert registry.status() == []
        assert first.read(0, 2).tobytes() == b"ok"
        first.release()
        assert second.read(0, 2).tobytes() == b"ok"
        second.release()
        with pytest.raises(OSError):  # its descriptor is closed now
            second.read(0, 2)


def test_an_object_removed_by_its_client_stays_readable(registry: SystemSharedMemory) -> None:
    with shm_object(64) as (key, handle):
        handle[:2] = b"hi"
        registry.register("r", key, 0, 64)
        os.unlink(f"/dev/shm{key}")
        region = registry.acquire("r")
        try:
            assert region.read(0, 2).tobytes() == b"hi"
        finally:
            region.release()


def test_an_object_shrunk_after_registration_is_an_error_not_a_crash(
    registry: SystemSharedMemory,
) -> None:
    with shm_object(8192) as (key, _):
        registry.register("r", key, 0, 8192)
        fd = os.open(f"/dev/shm{key}", os.O_RDWR)
        try:
            os.ftruncate(fd, 100)
        finally:
            os.close(fd)
        region = registry.acquire("r")
        try:
            with pytest.raises(InvalidArgumentError, match="made smaller"):
                region.read(0, 8192)
        finally:
            region.release()


def test_close_unregisters_everything() -> None:
    registry = SystemSharedMemory()
    with shm_object(64) as (key, _):
        registry.register("a", key, 0, 8)
        registry.close()
        assert registry.status() == []


@pytest.mark.parametrize(
    ("key", "name"),
    [("/abc", "abc"), ("abc", "abc"), ("///abc", "abc"), ("/a/b", None), ("/..", None)],
)
def test_object_name(key: str, name: str | None) -> None:
    assert object_name(key) == name


def test_cuda_without_cuda() -> None:
    cuda = CudaSharedMemory()
    assert cuda.status() == []
    with pytest.raises(RegionNotFoundError) as info:
        cuda.status("x")
    assert info.value.message == "Unable to find cuda shared memory region: 'x'"
    with pytest.raises(InvalidArgumentError) as refused:
        cuda.register("x", bytes(64), 0, 8)
    assert refused.value.message.startswith("failed to register shared memory region: invalid args")
    cuda.unregister("x")
    cuda.unregister()
