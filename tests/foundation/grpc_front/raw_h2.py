"""A raw HTTP/2 client (the ``h2`` library over a blocking socket) for sending what no
well-behaved gRPC client would: floods, bombs, stalls and malformed frames."""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence

import h2.config
import h2.connection
import h2.events
import h2.settings
from hyperframe.frame import ContinuationFrame, DataFrame, HeadersFrame

WAIT_S = 30.0


def grpc_request_headers(method: str) -> list[tuple[str, str]]:
    """The headers of a call to ``/t.Test/<method>``."""
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", f"/t.Test/{method}"),
        (":authority", "127.0.0.1"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]


def message(data: bytes) -> bytes:
    return b"\0" + len(data).to_bytes(4, "big") + data


class RawH2:
    """One HTTP/2 connection; events and what ended the connection are kept."""

    def __init__(self, address: str, settings: dict[int, int] | None = None) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=WAIT_S)
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self.conn = h2.connection.H2Connection(config)
        self.conn.initiate_connection()
        if settings:
            self.conn.update_settings(settings)
        self.events: list[h2.events.Event] = []
        self.is_closed = False
        self.flush()

    def flush(self) -> None:
        self.send_raw(self.conn.data_to_send())

    def send_raw(self, data: bytes) -> bool:
        """Send ``data``; False once the server has closed the connection."""
        if self.is_closed:
            return False
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            self.is_closed = True
            return False
        return True

    def request(self, method: str, body: bytes | None, *, end_stream: bool = True) -> int:
        """Open a call; returns its stream id."""
        stream_id = self.conn.get_next_available_stream_id()
        is_headers_only = body is None and end_stream
        self.conn.send_headers(stream_id, grpc_request_headers(method), end_stream=is_headers_only)
        if body is not None:
            self.conn.send_data(stream_id, body, end_stream=end_stream)
        self.flush()
        return stream_id

    def read_until(self, done: Callable[[Sequence[h2.events.Event]], bool]) -> bool:
        """Read until ``done(self.events)``, the server closes the connection or a read
        times out; returns whether ``done`` came true."""
        while not done(self.events):
            if self.is_closed:
                return False
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                return False
            except ConnectionResetError:
                data = b""
            if not data:
                self.is_closed = True
                return done(self.events)
            try:
                self.events += self.conn.receive_data(data)
            except h2.exceptions.ProtocolError:
                self.is_closed = True
                return done(self.events)
            self.flush()
        return True

    def ping_answered(self) -> bool:
        """Ping and wait for the answer: the connection still works."""
        if self.is_closed:
            return False
        self.conn.ping(b"8 bytes!")
        self.flush()
        return self.read_until(
            lambda events: any(isinstance(e, h2.events.PingAckReceived) for e in events)
        )

    def goaway(self) -> h2.events.ConnectionTerminated | None:
        for event in self.events:
            if isinstance(event, h2.events.ConnectionTerminated):
                return event
        return None

    def close(self) -> None:
        self.sock.close()


def headers_frame(stream_id: int, block: bytes, *, end_headers: bool) -> bytes:
    frame = HeadersFrame(stream_id, block)
    if end_headers:
        frame.flags.add("END_HEADERS")
    return bytes(frame.serialize())


def continuation_frame(stream_id: int, block: bytes, *, end_headers: bool = False) -> bytes:
    frame = ContinuationFrame(stream_id, block)
    if end_headers:
        frame.flags.add("END_HEADERS")
    return bytes(frame.serialize())


def data_frame(stream_id: int, data: bytes, *, end_stream: bool = False) -> bytes:
    frame = DataFrame(stream_id, data)
    if end_stream:
        frame.flags.add("END_STREAM")
    return bytes(frame.serialize())


SETTINGS = h2.settings.SettingCodes
