"""Pins and locks: what the evictor may take, and waits that end."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runtimes.cache.pins import (
    PIN_FILENAME,
    LockTimeoutError,
    Pin,
    exclusive_lock,
    try_exclusive,
)


def test_a_pinned_folder_cannot_be_taken(tmp_path: Path) -> None:
    pin = Pin.acquire(tmp_path, timeout_s=1, create=True)
    other = Pin.acquire(tmp_path, timeout_s=1)  # pins share
    assert try_exclusive(tmp_path / PIN_FILENAME) is None
    pin.release()
    assert try_exclusive(tmp_path / PIN_FILENAME) is None  # still one pin
    other.release()
    other.release()  # idempotent
    fd = try_exclusive(tmp_path / PIN_FILENAME)
    assert fd is not None
    try:
        with pytest.raises(LockTimeoutError):
            Pin.acquire(tmp_path, timeout_s=0.05)  # the evictor holds it
    finally:
        os.close(fd)


def test_dropped_pin_releases_its_lock(tmp_path: Path) -> None:
    Pin.acquire(tmp_path, timeout_s=1, create=True)  # dropped at once
    fd = try_exclusive(tmp_path / PIN_FILENAME)
    assert fd is not None
    os.close(fd)


def test_pin_needs_its_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        Pin.acquire(tmp_path, timeout_s=1)
    assert try_exclusive(tmp_path / "missing") is None


def test_pin_notices_its_folder_was_replaced(tmp_path: Path) -> None:
    folder = tmp_path / "v"
    folder.mkdir()
    with Pin.acquire(folder, timeout_s=1, create=True) as pin:
        assert pin.is_current()
        os.rename(folder, tmp_path / "trash")
        assert not pin.is_current()
        folder.mkdir()
        (folder / PIN_FILENAME).touch()
        assert not pin.is_current()
    assert not pin.is_held


def test_release_marks_last_use(tmp_path: Path) -> None:
    pin = Pin.acquire(tmp_path, timeout_s=1, create=True)
    os.utime(tmp_path / PIN_FILENAME, (0, 0))
    pin.release()
    assert (tmp_path / PIN_FILENAME).stat().st_mtime > 0


def test_exclusive_lock_waits_with_a_deadline(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    with exclusive_lock(lock, timeout_s=1):
        with pytest.raises(LockTimeoutError, match="within 0.05 s"):
            with exclusive_lock(lock, timeout_s=0.05):
                pass
    with exclusive_lock(lock, timeout_s=0.05):
        pass
