"""Triton's ``--cache-config`` read into the data plane's settings, in the environment too,
and ``zeroserve serve`` refusing a cache it does not offer before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from data_plane.response_cache import cache_config_overrides
from data_plane.settings import DataPlaneSettings
from zeroserve.cli import main


def test_the_local_cache_and_its_size() -> None:
    assert cache_config_overrides([]) == {}
    assert cache_config_overrides(["local,size=1048576"]) == {"response_cache_bytes": 1048576}
    settings = DataPlaneSettings(
        model_repository="repo", **cache_config_overrides(["local,size=4096"])
    )
    assert settings.response_cache_bytes == 4096


def test_the_environment_sets_the_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEROSERVE_DATA_PLANE_RESPONSE_CACHE_BYTES", "2048")
    assert DataPlaneSettings(model_repository="repo").response_cache_bytes == 2048
    monkeypatch.delenv("ZEROSERVE_DATA_PLANE_RESPONSE_CACHE_BYTES")
    assert DataPlaneSettings(model_repository="repo").response_cache_bytes == 0


@pytest.mark.parametrize(
    ("option", "message"),
    [
        pytest.param("local", "format is '<cache name>,<setting>=<value>'", id="no-setting"),
        pytest.param("local,size", "format is", id="no-value"),
        pytest.param(",size=10", "format is", id="no-cache-name"),
        pytest.param("redis,host=localhost", "cache 'redis' is not supported", id="redis"),
        pytest.param("local,capacity=10", "unknown setting 'capacity'", id="other-setting"),
        pytest.param("local,size=0", "positive number of bytes, got '0'", id="zero"),
        pytest.param("local,size=-5", "got '-5'", id="negative"),
        pytest.param("local,size=1MB", "got '1MB'", id="units"),
        pytest.param("local,size=１０", "got '１０'", id="non-ascii-digits"),
    ],
)
def test_other_options_are_refused(option: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cache_config_overrides([option])


def test_serve_refuses_a_bad_cache_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["serve", "--model-repository", str(tmp_path), "--cache-config", "redis,host=x"])
    assert status == 2
    assert "cache 'redis' is not supported by zeroserve" in capsys.readouterr().err
