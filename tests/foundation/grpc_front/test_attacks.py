"""The HTTP/2 attacks a public gRPC port meets, against the h2corn front end: each gets a
clear answer (a GOAWAY or reset with its reason, an HTTP or gRPC status), the server goes
on serving other clients, nothing is left running, and memory stays bounded.

The cases: rapid reset (CVE-2023-44487), an HPACK bomb, a CONTINUATION flood, more streams
than allowed, a frame over the maximum size, a message over the limit (refused from its
prefix), a client that never opens its flow-control window, and ping and SETTINGS floods.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import h2.events
import hpack
import pytest
from h2.errors import ErrorCodes

from foundation.grpc_limits import GrpcLimits
from tests.foundation.grpc_front.raw_h2 import (
    SETTINGS,
    RawH2,
    continuation_frame,
    data_frame,
    grpc_request_headers,
    headers_frame,
    message,
)
from tests.foundation.grpc_front.serving import Front, call, serving

MAX_STREAMS = 4
MAX_RECEIVE_BYTES = 1 << 20
RSS_GROWTH_BOUND_BYTES = 64 * 2**20
"""More than any attack here may add to the process (server and test client together)."""
WAIT_S = 30.0
GRANT_WAIT_S = 2.0


@pytest.fixture(scope="module")
def front() -> Iterator[Front]:
    limits = GrpcLimits(
        grpc_http2_max_concurrent_streams=MAX_STREAMS, grpc_max_receive_bytes=MAX_RECEIVE_BYTES
    )
    with serving(limits) as running:
        yield running


@pytest.fixture
def client(front: Front) -> Iterator[RawH2]:
    raw = RawH2(front.address)
    try:
        yield raw
    finally:
        raw.close()


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


@pytest.fixture(autouse=True)
def unharmed(front: Front) -> Iterator[None]:
    """After each attack: the server still answers, nothing is left running, and the
    process grew by less than the bound."""
    before = rss_bytes()
    yield
    assert call(front.address, "Echo", b"still serving") == b"gnivres llits"
    deadline = time.monotonic() + WAIT_S
    while front.app.active_rpcs:
        assert time.monotonic() < deadline, "calls left running after the attack"
        time.sleep(0.01)
    assert rss_bytes() - before < RSS_GROWTH_BOUND_BYTES


def ended(events: Sequence[h2.events.Event]) -> bool:
    kinds = (h2.events.StreamEnded, h2.events.StreamReset, h2.events.ConnectionTerminated)
    return any(isinstance(event, kinds) for event in events)


def terminated(events: Sequence[h2.events.Event]) -> bool:
    return any(isinstance(event, h2.events.ConnectionTerminated) for event in events)


def test_rapid_reset_is_cut_off(front: Front, client: RawH2) -> None:
    # Encoded first and sent at once, so that the server meets them at wire speed
    # whatever else the machine is doing.
    for _ in range(5000):
        stream_id = client.conn.get_next_available_stream_id()
        client.conn.send_headers(stream_id, grpc_request_headers("Slow"))
        client.conn.reset_stream(stream_id)
    client.send_raw(client.conn.data_to_send())
    client.read_until(terminated)
    # The server cuts the connection off: with GOAWAY ENHANCE_YOUR_CALM, or, where it
    # closes with the flood still unread, a reset that can overtake that GOAWAY.
    assert client.is_closed or client.goaway() is not None
    goaway = client.goaway()
    if goaway is not None:
        assert goaway.error_code == ErrorCodes.ENHANCE_YOUR_CALM


def test_hpack_bomb_is_refused(client: RawH2) -> None:
    # One 4 KB header indexed once, then referenced a thousand times by one byte each:
    # about 5 KB on the wire that decode to 4 MB.
    bomb = [("x-bomb", "a" * 4000)] * 1000
    stream_id = client.conn.get_next_available_stream_id()
    client.conn.send_headers(stream_id, grpc_request_headers("Echo") + bomb)
    client.conn.send_data(stream_id, message(b"hi"), end_stream=True)
    client.flush()
    assert client.read_until(ended)
    [response] = [e for e in client.events if isinstance(e, h2.events.ResponseReceived)]
    assert dict(response.headers)[b":status"] == b"431"
    assert client.ping_answered()


def test_continuation_flood_is_cut_off(client: RawH2) -> None:
    block = hpack.Encoder().encode(grpc_request_headers("Echo"))
    client.send_raw(headers_frame(1, block, end_headers=False))
    filler = hpack.Encoder().encode([(f"x-{i}", "v" * 100) for i in range(200)])[:16_000]
    for _ in range(3000):  # 48 MB of one header block, never ended
        if not client.send_raw(continuation_frame(1, filler)):
            break
    client.read_until(terminated)
    goaway = client.goaway()
    assert goaway is not None
    assert goaway.error_code == ErrorCodes.COMPRESSION_ERROR
    assert b"h2_max_header_block_size" in (goaway.additional_data or b"")


def test_more_streams_than_allowed_are_refused(front: Front, client: RawH2) -> None:
    # Sent before the server's SETTINGS are read, so the client library does not hold
    # the extra streams back itself.
    for _ in range(MAX_STREAMS + 2):
        stream_id = client.conn.get_next_available_stream_id()
        client.conn.send_headers(stream_id, grpc_request_headers("Slow"))
        client.conn.send_data(stream_id, message(b""), end_stream=True)
    client.flush()
    assert client.read_until(
        lambda events: sum(isinstance(e, h2.events.StreamReset) for e in events) == 2
    )
    resets = [e for e in client.events if isinstance(e, h2.events.StreamReset)]
    assert {reset.error_code for reset in resets} == {ErrorCodes.REFUSED_STREAM}
    assert client.ping_answered()
    assert front.app.active_rpcs == MAX_STREAMS
    client.close()  # ends the held calls


def test_oversized_frame_is_a_connection_error(client: RawH2) -> None:
    stream_id = client.conn.get_next_available_stream_id()
    client.conn.send_headers(stream_id, grpc_request_headers("Echo"))
    client.flush()
    client.send_raw(data_frame(stream_id, bytes(70_000)))  # the limit is 65,536
    client.read_until(terminated)
    goaway = client.goaway()
    assert goaway is not None
    assert goaway.error_code == ErrorCodes.FRAME_SIZE_ERROR


def test_oversized_message_is_refused_from_its_prefix(client: RawH2) -> None:
    claimed = 2**31 - 1
    prefix = b"\0" + claimed.to_bytes(4, "big")
    client.request("Echo", prefix, end_stream=False)  # the rest never comes
    assert client.read_until(
        lambda events: any(isinstance(e, h2.events.TrailersReceived) for e in events)
    )
    [trailers] = [e for e in client.events if isinstance(e, h2.events.TrailersReceived)]
    expected = f"Received message larger than max ({claimed} vs. {MAX_RECEIVE_BYTES})"
    assert dict(trailers.headers) == {b"grpc-status": b"8", b"grpc-message": expected.encode()}


def test_stalled_flow_control_window_holds_only_its_own_stream(
    front: Front, caplog: pytest.LogCaptureFixture
) -> None:
    # A client that lets nothing be sent to it: the server stops reading its stream once
    # its answers fill the buffers, instead of buffering them without end.
    client = RawH2(front.address, {SETTINGS.INITIAL_WINDOW_SIZE: 0})
    try:
        client.read_until(
            lambda events: any(isinstance(e, h2.events.SettingsAcknowledged) for e in events)
        )
        stream_id = client.request("Chat", None, end_stream=False)
        chunk = message(b"z" * 16_000)
        sent = 0
        # Window updates are read with a short timeout: one not granted within it counts as
        # withheld (a slow server makes the test pass more easily, never fail).
        client.sock.settimeout(GRANT_WAIT_S)
        for _ in range(3000):  # 48 MB asked for, 96 MB of answers
            is_open = client.read_until(
                lambda _: client.conn.local_flow_control_window(stream_id) >= len(chunk)
            )
            if not is_open:
                break
            client.conn.send_data(stream_id, chunk)
            client.flush()
            sent += len(chunk)
        assert sent < 20 * 2**20, "the server kept reading a stream nobody reads answers of"
        # Other clients are served meanwhile (the autouse fixture checks it again after).
        assert call(front.address, "Echo", b"ab") == b"ba"
    finally:
        client.close()
    # The held stream's answers meet a closed connection (h2corn raises its
    # SendAfterCloseError, an OSError): the call ends quietly, not as a logged bug.
    deadline = time.monotonic() + WAIT_S
    while front.app.active_rpcs:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert not [r for r in caplog.records if r.name.startswith("foundation.grpc_front")]


def test_ping_flood_is_answered_without_harm(client: RawH2) -> None:
    for i in range(20_000):
        client.conn.ping(i.to_bytes(8, "big"))
        if i % 500 == 0 and not client.send_raw(client.conn.data_to_send()):
            break
    client.flush()
    assert client.ping_answered()


def test_settings_flood_is_answered_without_harm(client: RawH2) -> None:
    for i in range(20_000):
        client.conn.update_settings({SETTINGS.ENABLE_PUSH: 0})
        if i % 500 == 0 and not client.send_raw(client.conn.data_to_send()):
            break
    client.flush()
    assert client.ping_answered()
