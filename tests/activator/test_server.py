"""Shutdown order and the command line, without serving."""

from __future__ import annotations

import signal

import pytest
from starlette.types import Receive, Scope, Send

from activator.__main__ import main
from activator.server import create_server
from activator.settings import ActivatorSettings
from activator.state import Lifecycle


async def _app_placeholder(scope: Scope, receive: Receive, send: Send) -> None:
    raise AssertionError("not served in these tests")


@pytest.mark.anyio
async def test_a_signal_fails_readiness_before_connections_stop() -> None:
    lifecycle = Lifecycle()
    settings = ActivatorSettings(readiness_propagation_s=3600)
    server = create_server(_app_placeholder, settings, lifecycle)
    server.handle_exit(signal.SIGTERM, None)
    assert lifecycle.is_stopping
    assert not server.should_exit
    # A second signal does not wait for propagation.
    server.handle_exit(signal.SIGTERM, None)
    assert server.should_exit


def test_without_propagation_a_signal_stops_at_once() -> None:
    lifecycle = Lifecycle()
    server = create_server(_app_placeholder, ActivatorSettings(), lifecycle)
    server.handle_exit(signal.SIGINT, None)
    assert lifecycle.is_stopping
    assert server.should_exit


def test_invalid_settings_exit_with_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--port", "70000"]) == 2
    assert "invalid settings" in capsys.readouterr().err


def test_an_unknown_state_url_is_refused() -> None:
    with pytest.raises(SystemExit, match="unsupported state store URL"):
        main(["--state", "etcd://somewhere", "--log-level", "warning"])
