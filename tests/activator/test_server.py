"""The activator's server and its command line. How a signal stops it (readiness first) is
the one bootstrap's, tested in ``tests/foundation/test_serving.py``."""

from __future__ import annotations

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from activator.__main__ import main
from activator.server import create_server
from activator.settings import ActivatorSettings
from foundation.serving import bind_socket


@pytest.mark.anyio
async def test_the_server_adds_no_date_or_server_header_of_its_own() -> None:
    """Proxied answers carry the workers' Date and Server headers; uvicorn's would repeat them."""

    async def hello(request: object) -> PlainTextResponse:
        return PlainTextResponse("hello", headers={"server": "worker"})

    app = Starlette(routes=[Route("/", hello)])
    sock = bind_socket("127.0.0.1", 0)
    async with create_server(app, ActivatorSettings(), sock, start_timeout_s=30) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            response = await client.get("/")
    assert response.text == "hello"
    assert response.headers.get_list("server") == ["worker"]
    assert "date" not in response.headers


def test_invalid_settings_exit_with_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--port", "70000"]) == 2
    assert "invalid settings" in capsys.readouterr().err


def test_an_unknown_state_url_is_refused() -> None:
    with pytest.raises(SystemExit, match="unsupported state store URL"):
        main(["--state", "etcd://somewhere", "--log-level", "warning"])
