"""A trivial V2 endpoint, as cheap as an HTTP server in Python gets: the load generator's ceiling
is measured against it (``bench/loadgen_ceiling.py``).

One process, one uvloop event loop, one ``asyncio.Protocol`` per connection, requests parsed
by ``httptools`` (keep-alive and pipelining handled properly). It answers every POST with the
same pre-built V2 infer answer, ``GET /v2/models/{name}`` with the metadata of one
``INPUT0`` FP32 ``[-1, 4]`` input, the health paths with 200, and anything else with 404.
Nothing is computed per request: the bytes of each answer are built at start.

    python bench/trivial_server.py --port 8999
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from typing import Final, cast

import httptools

_INFER_ANSWER: Final = json.dumps(
    {
        "model_name": "trivial",
        "model_version": "1",
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 1], "data": [0.0]}],
    },
    separators=(",", ":"),
).encode()


def _answer(status: str, body: bytes, content_type: str = "application/json") -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _metadata(name: str) -> bytes:
    document = {
        "name": name,
        "versions": ["1"],
        "platform": "trivial",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 1]}],
    }
    return _answer("200 OK", json.dumps(document).encode())


_OK_INFER: Final = _answer("200 OK", _INFER_ANSWER)
_OK_EMPTY: Final = _answer("200 OK", b"")
_NOT_FOUND: Final = _answer("404 Not Found", b'{"error":"Not Found"}')


class _Connection(asyncio.Protocol):
    """Answers each request on its connection as soon as its last byte has arrived."""

    def __init__(self) -> None:
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._url = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            if self._transport is not None:
                self._transport.close()

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_message_complete(self) -> None:
        url, self._url = self._url, b""
        assert self._transport is not None
        method = self._parser.get_method()
        if method == b"POST":
            self._transport.write(_OK_INFER)
        elif url.startswith(b"/v2/health/") or url == b"/v2":
            self._transport.write(_OK_EMPTY)
        elif url.startswith(b"/v2/models/") and url.count(b"/") == 3:
            self._transport.write(_metadata(url.rsplit(b"/", 1)[1].decode()))
        else:
            self._transport.write(_NOT_FOUND)
        if not self._parser.should_keep_alive():
            self._transport.close()


async def serve(host: str, port: int) -> None:
    """Serve until SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = await loop.create_server(_Connection, host, port, backlog=1024)
    try:
        await stop.wait()
    finally:
        server.close()
        await server.wait_closed()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(args.host, args.port))
        return
    uvloop.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
