"""The control messages between the server and a stub, and their framing.

A message is a JSON object with a ``kind``, sent as a 4-byte little-endian length and
the UTF-8 JSON text over the stub's Unix socket. Messages carry only small things: names,
shapes, offsets, error texts. Tensor data is in the arenas (:mod:`.arena`), described by
``{"name", "datatype", "shape", "offset", "nbytes"}``; never in a message.

Kinds, server to stub:

``init``          ``{path, version, name, args, decoupled}``: import ``model.py`` at ``path``
                  (version folder ``version``), build ``TritonPythonModel`` and call its
                  ``initialize(args)``. Answer ``init_done``.
``auto_complete`` ``{path, version, name, config}``: import, call the class's
                  ``auto_complete_config`` on ``config`` (Triton's JSON). Answer
                  ``auto_complete_done``; the stub then exits.
``execute``       ``{id, requests: [{id, correlation_id, parameters, requested, flags,
                  inputs: [tensor]}]}``: one ``execute(requests)`` call. The input blocks are
                  the server's until the answer ``result`` with the same ``id`` arrives.
                  ``init`` also carries ``call_timeout_s``, the longest a model waits for
                  any answer of the server.
``finalize``      ``{}``: call ``finalize()``, answer ``finalize_done``, exit.
``cancelled``     ``{call, value}``: the answer to ``is_cancelled``.
``response_done`` ``{call, error}``: the server took a ``response`` (``error``: it refused
                  it); sent once the client's side has room, so a sender waits for a
                  slow client.
``metric_done``   ``{call, value, error}``: the answer to ``metric`` (``value``: a new
                  handle or the value read; ``error``: Triton's core text).
``bls_result``    ``{call, final, error | outputs}``: a BLS call's response, one or, for
                  ``decoupled`` calls, several (``final`` on the last). The output blocks
                  are the stub's to copy out; it sends ``release`` for them.

Kinds, stub to server:

``hello``         ``{pid, python}``: sent first, before the stub imports numpy.
``init_done``     ``{error}``: ``error`` is None or Triton's load error text.
``auto_complete_done`` ``{config | error}``.
``result``        ``{id, error, responses}``: ``error`` (the whole batch failed) or one
                  entry per request: ``{outputs: [tensor]}``, ``{error: {code, message}}``
                  or None, or ``responses`` None (execute returned None: the answers went
                  through response senders). The output blocks are the stub's until its
                  next ``execute`` or ``finalize`` (the server copies them out on receipt).
``log``           ``{level, message}``: ``pb_utils.Logger`` output.
``is_cancelled``  ``{call, id, request}``: whether request ``request`` (an index) of
                  execution ``id`` was cancelled by its client; answered by ``cancelled``.
``response``      ``{call, id, request, outputs, error, final}``: a response sent through a
                  response sender; answered by ``response_done``, after which the stub
                  frees its blocks.
``bls``           ``{call, model, version, inputs, requested, request_id, correlation_id,
                  flags, timeout, parameters, decoupled}``: a BLS request, its input blocks
                  freed by the stub at the first ``bls_result``.
``bls_cancel``    ``{call}``: cancel a BLS call.
``metric``        ``{call, op, args}``: a custom-metric operation (``family``, ``metric``,
                  ``increment``, ``set``, ``observe``, ``value``), answered by
                  ``metric_done``; ``delete`` comes without ``call`` and gets no answer.
``release``       ``{offsets}``: blocks of the input arena the stub has copied out.
``finalize_done`` ``{}``.

The text is written and read with orjson where the interpreter has it (the server's always
does; a stub in a model's own environment may not) and with the standard library's json
otherwise; both read what either writes. orjson takes a fraction of json's time (a
25-request ``execute`` written in 4.8 µs against 52.3, its ``result`` read in 9.4 against
30.7), and what it refuses goes to json: an integer past 64 bits, and the NaN and Infinity
that json writes for such floats. (orjson writes a NaN float as null instead of refusing it;
the messages carry no free floats but a BLS call's timeout, and a request's parameters
travel as text encoded with json.)

Standard library only besides that optional orjson: the stub frames its first message
before importing numpy.
"""

from __future__ import annotations

import json
import select
import socket
import struct
from collections import deque
from collections.abc import Iterator
from typing import Any, Final

try:
    import orjson
except ImportError:  # a model's own environment without it: json alone
    orjson = None  # type: ignore[assignment]

HEADER: Final = struct.Struct("<I")
"""The length prefix of every message."""
MAX_MESSAGE_BYTES: Final = 64 * 1024 * 1024
"""A message longer than this is refused as corrupt (messages hold no tensor data)."""
# Built once: json.dumps with arguments builds a new encoder per call (a few microseconds
# on every message of the hot path).
_ENCODER: Final = json.JSONEncoder(separators=(",", ":"))

Message = dict[str, Any]


class ChannelClosedError(Exception):
    """The peer closed the socket (or died) before a whole message arrived."""


def encode(message: Message) -> bytes:
    """The framed bytes of ``message`` (orjson's text where it can write it)."""
    if orjson is not None:
        try:
            body = orjson.dumps(message)
        except orjson.JSONEncodeError:
            return encode_json(message)
        return HEADER.pack(len(body)) + body
    return encode_json(message)


def decode(body: bytes) -> Message:
    """The message in a frame's body; ValueError when it is not a JSON object."""
    if orjson is not None:
        try:
            return checked(orjson.loads(body))
        except orjson.JSONDecodeError:
            pass
    return decode_json(body)


def encode_json(message: Message) -> bytes:
    """:func:`encode` with the standard library's json alone."""
    body = _ENCODER.encode(message).encode("utf-8")
    return HEADER.pack(len(body)) + body


def decode_json(body: bytes) -> Message:
    """:func:`decode` with the standard library's json alone."""
    return checked(json.loads(body))


def checked(message: object) -> Message:
    """``message`` if it is an object with a ``kind``; ValueError otherwise."""
    if not isinstance(message, dict) or not isinstance(message.get("kind"), str):
        raise ValueError("a stub message must be a JSON object with a 'kind'")
    return message


def body_length(header: bytes | bytearray) -> int:
    """The body length a frame's header (the first bytes of ``header``) announces;
    ValueError past the bound."""
    (length,) = HEADER.unpack_from(header)
    if length > MAX_MESSAGE_BYTES:
        raise ValueError(f"stub message of {length} bytes exceeds {MAX_MESSAGE_BYTES}")
    return int(length)


class FrameBuffer:
    """Bytes as they arrive in, whole messages out (frames may be split or joined)."""

    def __init__(self) -> None:
        self._data = bytearray()

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        self._data += data

    def messages(self) -> Iterator[Message]:
        """The messages complete so far, in order; ValueError for a malformed frame."""
        data = self._data
        while len(data) >= HEADER.size:
            end = HEADER.size + body_length(data)
            if len(data) < end:
                return
            body = bytes(data[HEADER.size : end])
            del data[:end]
            yield decode(body)


class Channel:
    """Messages over a blocking socket, read in as few system calls as arrive."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._poll = select.poll()
        self._poll.register(sock, select.POLLIN)
        self._frames = FrameBuffer()
        self._ready: deque[Message] = deque()
        # One buffer for every read: recv(n) would allocate n bytes each time.
        self._buffer = bytearray(1 << 16)
        self._view = memoryview(self._buffer)

    def send(self, message: Message) -> None:
        self.sock.sendall(encode(message))

    def receive(self, timeout_s: float | None = None) -> Message:
        """The next message; ChannelClosedError at end of stream, TimeoutError when no
        byte arrives within ``timeout_s`` (None: wait for ever). One thread at a time.

        The socket stays blocking (other threads send on it, and must not fail for a
        peer slow to read); the bound is a poll before each read.
        """
        while not self._ready:
            if timeout_s is not None and not self._poll.poll(timeout_s * 1000.0):
                raise TimeoutError(f"nothing arrived within {timeout_s} s")
            count = self.sock.recv_into(self._buffer)
            if not count:
                raise ChannelClosedError("the peer closed the stub channel")
            self._frames.feed(self._view[:count])
            self._ready.extend(self._frames.messages())
        return self._ready.popleft()


def send(sock: socket.socket, message: Message) -> None:
    """Send one message on a blocking socket."""
    sock.sendall(encode(message))


def receive(sock: socket.socket) -> Message:
    """Read one message from a blocking socket (honouring its timeout), and not a byte
    more: for a single exchange before the socket changes hands.

    Raises ChannelClosedError at end of stream, TimeoutError past the socket's timeout.
    """
    length = body_length(_read_exactly(sock, HEADER.size))
    return decode(_read_exactly(sock, length))


def _read_exactly(sock: socket.socket, count: int) -> bytes:
    buffer = bytearray(count)
    view = memoryview(buffer)
    done = 0
    while done < count:
        got = sock.recv_into(view[done:])
        if got == 0:
            raise ChannelClosedError("the peer closed the stub channel")
        done += got
    return bytes(buffer)
