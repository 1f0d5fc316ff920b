from __future__ import annotations

import pytest
from pydantic import ValidationError

from activator.settings import ActivatorSettings


def test_defaults() -> None:
    settings = ActivatorSettings()
    assert settings.buffer_max_requests == 1000
    assert settings.activation_timeout_s == 120.0
    # Idle upstream connections must be dropped before uvicorn workers drop them (5 s).
    assert settings.upstream_keepalive_expiry_s < 5.0


def test_environment_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEROSERVE_ACTIVATOR_BUFFER_MAX_REQUESTS", "7")
    monkeypatch.setenv("ZEROSERVE_ACTIVATOR_STATE_URL", "redis://cache:6379/0")
    settings = ActivatorSettings()
    assert settings.buffer_max_requests == 7
    assert settings.state_url == "redis://cache:6379/0"


def test_grpc_front_end(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ZEROSERVE_ACTIVATOR_GRPC_FRONTEND", raising=False)
    assert ActivatorSettings().grpc_frontend == "h2corn"
    # grpc.aio stays selectable, and alone takes its keepalive settings.
    monkeypatch.setenv("ZEROSERVE_ACTIVATOR_GRPC_KEEPALIVE_TIME_MS", "60000")
    with pytest.raises(ValidationError, match="need grpc_frontend 'aio'"):
        ActivatorSettings()
    monkeypatch.setenv("ZEROSERVE_ACTIVATOR_GRPC_FRONTEND", "aio")
    settings = ActivatorSettings()
    assert (settings.grpc_frontend, settings.grpc_keepalive_time_ms) == ("aio", 60000)


def test_frozen() -> None:
    settings = ActivatorSettings()
    with pytest.raises(ValidationError):
        settings.port = 1


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({"buffer_max_requests": 0}, id="empty-buffer"),
        pytest.param({"activation_timeout_s": 0}, id="no-deadline"),
        pytest.param({"release_concurrency": 0}, id="no-release"),
        pytest.param({"port": 70000}, id="port"),
        pytest.param(
            {"upstream_max_connections": 10, "upstream_max_keepalive_connections": 11},
            id="keepalive-over-max",
        ),
    ],
)
def test_invalid_values_are_refused(overrides: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ActivatorSettings(**overrides)  # type: ignore[arg-type]
