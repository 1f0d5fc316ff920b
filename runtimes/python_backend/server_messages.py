"""The server's side of the stub messages' JSON, written and read with orjson.

The stub frames its messages with the standard library's json (:mod:`.messages`: it may run
in a model's own environment, and speaks before it imports anything else); the server has
orjson, which reads and writes the same text in a fraction of the time. At the benchmark's
c=64 the standard library's JSON took a tenth of the server's samples (py-spy), almost all
of it reading the stubs' results.

What orjson refuses falls back to json, so both sides still accept the same messages: an
integer past 64 bits, and the NaN and Infinity that json writes for such floats. (orjson
writes a NaN float as null rather than refusing it; the server sends no free floats: a
request's parameters travel as text the runtime encoded with json.)
"""

from __future__ import annotations

import orjson

from runtimes.python_backend import messages
from runtimes.python_backend.messages import HEADER, Message


def encode(message: Message) -> bytes:
    """The framed bytes of ``message`` (the text :func:`messages.decode` reads)."""
    try:
        body = orjson.dumps(message)
    except orjson.JSONEncodeError:
        return messages.encode(message)
    return HEADER.pack(len(body)) + body


def decode(body: bytes) -> Message:
    """The message in a frame's body; ValueError when it is not a JSON object."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return messages.decode(body)
    return messages.checked(parsed)
