"""Driving an in-process ASGI app with generated requests from hypothesis's synchronous tests.

Hypothesis runs each example as a plain call, so the app's client lives on an event loop this
module owns and runs one request at a time; each answer is checked for what no input may
cause: a 5xx, or an answer slow enough to tie the server up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import schemathesis
from hypothesis import HealthCheck, settings, strategies as st
from schemathesis.core.result import Err

# A generous bound on one in-process answer: the point is "no request that ties the server
# up", not a latency target (those live in bench/).
SLOW_S = 10.0
FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)


class FuzzClient:
    """Sends one request at a time to an app served on ``loop``; fails on 5xx or slowness."""

    def __init__(self, loop: asyncio.AbstractEventLoop, client: httpx.AsyncClient) -> None:
        self.loop = loop
        self.client = client

    def send(self, **request: Any) -> httpx.Response:
        if "json" in request:
            # NaN and infinities too: httpx's encoder refuses them, a hostile client need not.
            request["content"] = json.dumps(request.pop("json")).encode()
            request["headers"] = {**request.get("headers", {}), "Content-Type": "application/json"}
        request.pop("cookies", None)
        started = time.monotonic()
        response = self.loop.run_until_complete(
            asyncio.wait_for(self.client.request(**request), SLOW_S * 3)
        )
        elapsed = time.monotonic() - started
        # 503 with Retry-After is the API's documented "not now" (no worker with room for the
        # model as a fuzzed change left it, e.g. on a device this machine lacks), not a fault.
        is_try_later = response.status_code == 503 and "retry-after" in response.headers
        assert response.status_code < 500 or is_try_later, (
            request,
            response.status_code,
            response.text,
        )
        assert elapsed < SLOW_S, (request, elapsed)
        return response


@contextlib.contextmanager
def serving(context: contextlib.AbstractAsyncContextManager[Any]) -> Iterator[FuzzClient]:
    """Enter ``context`` (yielding something with a ``client``) on a loop of its own."""
    loop = asyncio.new_event_loop()
    try:
        served = loop.run_until_complete(context.__aenter__())
        try:
            yield FuzzClient(loop, served.client)
        finally:
            loop.run_until_complete(context.__aexit__(None, None, None))
    finally:
        loop.close()


def operations(document: dict[str, Any]) -> list[Any]:
    """Every operation of an OpenAPI document; a document schemathesis cannot read fails."""
    found = []
    for result in schemathesis.openapi.from_dict(document).get_all_operations():
        if isinstance(result, Err):
            raise result.err()
        found.append(result.ok())
    return found


def cases(
    operation: Any, aim: Callable[[st.DrawFn, Any], None], base_url: str
) -> st.SearchStrategy[dict[str, Any]]:
    """Requests schemathesis generates for ``operation``; ``aim`` may rewrite each case
    (point its path at something that exists) before it becomes request arguments."""

    @st.composite
    def draw_case(draw: st.DrawFn) -> dict[str, Any]:
        case = draw(operation.as_strategy())
        aim(draw, case)
        request: dict[str, Any] = case.as_transport_kwargs(base_url=base_url)
        return request

    return draw_case()


__all__ = ["FUZZ", "SLOW_S", "FuzzClient", "cases", "operations", "serving"]
