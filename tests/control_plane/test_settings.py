"""The control plane's settings: environment names, ranges, defaults."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from control_plane.settings import AdminClientSettings, ControlPlaneSettings, PoolSettings

VLLM_POOL = {"name": "vllm", "backends": ["vllm"], "device": "cuda"}


def test_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("ZEROSERVE_ADMIN_TOKEN", "from-the-env-123")
    monkeypatch.setenv("ZEROSERVE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("ZEROSERVE_ALLOWED_STORAGE", "s3://bucket/prefix, /models ,")
    monkeypatch.setenv("ZEROSERVE_CONTROL_PLANE_MAX_WORKERS", "7")
    monkeypatch.setenv("ZEROSERVE_CONTROL_PLANE_STATE_URL", "redis://127.0.0.1:6379/0")
    settings = ControlPlaneSettings()
    assert settings.admin_token is not None
    assert settings.admin_token.get_secret_value() == "from-the-env-123"
    assert "from-the-env" not in repr(settings)
    assert settings.cache_dir == tmp_path
    assert settings.allowed_storage == ("s3://bucket/prefix", "/models")
    assert settings.max_workers == 7
    assert settings.state_url == "redis://127.0.0.1:6379/0"


def test_defaults_are_safe(monkeypatch: pytest.MonkeyPatch):
    for name in ("ZEROSERVE_ADMIN_TOKEN", "ZEROSERVE_ALLOWED_STORAGE"):
        monkeypatch.delenv(name, raising=False)
    settings = ControlPlaneSettings()
    assert settings.admin_host == "127.0.0.1"
    assert settings.admin_token is None
    assert settings.allowed_storage == ()
    assert settings.lease_renew_s == pytest.approx(settings.lease_ttl_s / 3)


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({"warm_workers": 5, "max_workers": 2}, id="warm-over-max"),
        pytest.param({"max_workers": 0}, id="no-workers"),
        pytest.param({"admin_token": "short"}, id="short-token"),
        pytest.param({"panic_window_s": 100.0, "stable_window_s": 60.0}, id="panic-over-stable"),
        pytest.param(
            {"activation_backoff_initial_s": 10.0, "activation_backoff_max_s": 5.0},
            id="backoff-initial-over-max",
        ),
        pytest.param({"activation_backoff_initial_s": 0.0}, id="backoff-zero"),
        pytest.param({"inspect_timeout_s": 0.0}, id="inspect-timeout-zero"),
        pytest.param({"panic_threshold": 1.0}, id="threshold"),
        pytest.param({"backend": "docker"}, id="unknown-backend"),
        pytest.param({"load_timeout_s": 0}, id="timeout"),
        pytest.param({"extra_pools": [{**VLLM_POOL, "name": "default"}]}, id="pool-name-twice"),
        pytest.param({"extra_pools": [{**VLLM_POOL, "backends": []}]}, id="pool-no-backends"),
        pytest.param(
            {"extra_pools": [VLLM_POOL, {**VLLM_POOL, "name": "vllm-2"}]}, id="backend-twice"
        ),
        pytest.param(
            {"extra_pools": [{**VLLM_POOL, "warm_workers": 5, "max_workers": 2}]},
            id="pool-warm-over-max",
        ),
        pytest.param({"extra_pools": [{**VLLM_POOL, "gpus": 1}]}, id="pool-unknown-field"),
    ],
)
def test_ranges(overrides: dict[str, object]):
    with pytest.raises(ValidationError):
        ControlPlaneSettings(**overrides)  # type: ignore[arg-type]


def test_pools_from_the_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("ZEROSERVE_CONTROL_PLANE_POOL", "gpu")
    monkeypatch.setenv("ZEROSERVE_CONTROL_PLANE_WORKER_DEVICE", "cuda")
    monkeypatch.setenv("ZEROSERVE_CONTROL_PLANE_MAX_WORKERS", "3")
    monkeypatch.setenv(
        "ZEROSERVE_CONTROL_PLANE_EXTRA_POOLS",
        '[{"name": "vllm", "backends": ["vllm"], "device": "cuda", "memory_bytes": 1000,'
        ' "host_memory_bytes": 2000, "max_workers": 2, "warm_workers": 1}]',
    )
    settings = ControlPlaneSettings()
    gpu, vllm = settings.all_pools
    assert gpu == PoolSettings(name="gpu", device="cuda", max_workers=3)
    assert vllm.backends == ("vllm",)
    pool_settings = settings.for_pool(vllm)
    assert (pool_settings.pool, pool_settings.worker_device) == ("vllm", "cuda")
    assert pool_settings.worker_memory_bytes == 1000
    assert pool_settings.worker_host_memory_bytes == 2000
    assert (pool_settings.max_workers, pool_settings.warm_workers) == (2, 1)
    assert settings.for_pool(gpu).max_workers == 3


def test_one_pool_by_default():
    settings = ControlPlaneSettings()
    assert [pool.name for pool in settings.all_pools] == [settings.pool]
    assert settings.for_pool(settings.all_pools[0]) == settings


def test_frozen():
    settings = ControlPlaneSettings()
    with pytest.raises(ValidationError):
        settings.max_workers = 3


def test_admin_client(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("ZEROSERVE_ADMIN_URL", "http://10.0.0.1:9000")
    monkeypatch.setenv("ZEROSERVE_ADMIN_TOKEN", "tok-tok-tok")
    settings = AdminClientSettings()
    assert settings.url == "http://10.0.0.1:9000"
    assert settings.token is not None and settings.token.get_secret_value() == "tok-tok-tok"
