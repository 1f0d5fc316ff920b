"""Warm engine folders: atomic publication, races, pins, and the key's ingredients."""

from __future__ import annotations

import os
from pathlib import Path

from runtimes.cache.engines import (
    COMPLETE,
    EngineCache,
    hardware_identity,
    model_identity,
)
from runtimes.cache.pins import PIN_FILENAME, try_exclusive


def test_build_publish_open(tmp_path: Path) -> None:
    engines = EngineCache(tmp_path, "onnxruntime")
    key = engines.key({"model": "m", "version": 1})
    assert engines.open(key) is None
    with engines.build(key) as build:
        (build.path / "engine.bin").write_bytes(b"built")
        assert engines.open(key) is None  # not visible before it is published
        pin = build.publish({"note": "test"})
    folder = tmp_path / "engines" / "onnxruntime" / key
    assert pin.path == folder / PIN_FILENAME and pin.is_held
    assert (folder / "engine.bin").read_bytes() == b"built"
    assert (folder / COMPLETE).is_file()
    assert try_exclusive(folder / PIN_FILENAME) is None  # pinned: not evictable
    pin.release()
    again = engines.open(key)
    assert again is not None
    again.release()
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_failed_build_leaves_nothing(tmp_path: Path) -> None:
    engines = EngineCache(tmp_path, "onnxruntime")
    try:
        with engines.build("k") as build:
            (build.path / "half").write_bytes(b"x")
            raise RuntimeError("engine build failed")
    except RuntimeError:
        pass
    assert list((tmp_path / "tmp").iterdir()) == []
    assert not (tmp_path / "engines" / "onnxruntime" / "k").exists()


def test_second_publisher_keeps_the_first_engine(tmp_path: Path) -> None:
    engines = EngineCache(tmp_path, "onnxruntime")
    with engines.build("k") as first, engines.build("k") as second:
        (first.path / "engine.bin").write_bytes(b"first")
        (second.path / "engine.bin").write_bytes(b"second")
        pins = [first.publish({}), second.publish({})]
    folder = tmp_path / "engines" / "onnxruntime" / "k"
    assert (folder / "engine.bin").read_bytes() == b"first"
    assert all(p.path == folder / PIN_FILENAME for p in pins)
    for pin in pins:
        pin.release()
    assert list((tmp_path / "tmp").iterdir()) == []


def test_discard_spares_a_pinned_engine(tmp_path: Path) -> None:
    engines = EngineCache(tmp_path, "onnxruntime")
    with engines.build("k") as build:
        pin = build.publish({})
    engines.discard("k")
    assert (tmp_path / "engines" / "onnxruntime" / "k").is_dir()
    pin.release()
    engines.discard("k")
    assert not (tmp_path / "engines" / "onnxruntime" / "k").exists()


def test_shared_folder_reports_whether_it_held_an_engine(tmp_path: Path) -> None:
    engines = EngineCache(tmp_path, "onnxruntime")
    pin, had = engines.shared("trt-key")
    assert not had
    (pin.path.parent / "trt").mkdir()
    pin.release()
    pin, had = engines.shared("trt-key")
    assert had
    pin.release()


def test_key_ingredients(tmp_path: Path) -> None:
    (tmp_path / "model.onnx").write_bytes(b"abc")
    first = model_identity(tmp_path)
    assert [(rel, size) for rel, size, _ in first] == [("model.onnx", 3)]
    stat = (tmp_path / "model.onnx").stat()
    os.utime(tmp_path / "model.onnx", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert model_identity(tmp_path) != first
    cpu = hardware_identity("cpu")
    assert cpu["device"] == "cpu" and "cpu_flags" in cpu
    assert "driver" in hardware_identity("cuda:0")
