"""Reading the few fields routing needs straight from a serialized protobuf message.

The router passes messages through as bytes; all it needs of a request is the model's name
(field 1 of every per-model request: ``ModelInferRequest.model_name``,
``ModelMetadataRequest.name``...) and, in a stream, its ``id`` (field 3), to answer a request
it cannot route; and, for sequence models, the ``sequence_*`` entries of its parameters
(field 4). Parsing a whole ModelInferRequest would copy every tensor's bytes into a
message object the router then throws away; this walks only the message's top-level
fields, skipping each length-delimited value by its length, so the cost is a few
microseconds whatever the tensors weigh. Values are read as protobuf does: the last
occurrence of a field wins, and a string must be valid UTF-8.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Final

from activator.sequences import SequenceTag

__all__ = ["MalformedMessageError", "sequence_tag", "string_fields", "submessage_string"]

_VARINT = 0
_FIXED64 = 1
_LENGTH_DELIMITED = 2
_FIXED32 = 5
_MAX_VARINT_BYTES = 10


class MalformedMessageError(ValueError):
    """The bytes are not a protobuf message (truncated, a bad tag or wire type, a string
    that is not UTF-8)."""


def string_fields(data: bytes | memoryview, numbers: Iterable[int]) -> dict[int, str]:
    """The string fields ``numbers`` of the message in ``data`` (absent ones are left out,
    as they read as "" in protobuf).

    Raises:
        MalformedMessageError: ``data`` is not a well-formed message.
    """
    raw = _length_delimited(data, frozenset(numbers))
    try:
        return {number: bytes(value).decode("utf-8") for number, value in raw.items()}
    except UnicodeDecodeError:
        raise MalformedMessageError("a string field is not valid UTF-8") from None


def submessage_string(data: bytes | memoryview, outer: int, inner: int) -> str:
    """String field ``inner`` of the message in field ``outer`` of ``data`` ("" when either
    is absent). Only the last occurrence of ``outer`` is read; protobuf would merge several,
    which a serializer never writes.

    Raises:
        MalformedMessageError: ``data`` is not a well-formed message.
    """
    nested = _length_delimited(data, frozenset((outer,))).get(outer)
    if nested is None:
        return ""
    return string_fields(nested, (inner,)).get(inner, "")


def _length_delimited(data: bytes | memoryview, wanted: frozenset[int]) -> dict[int, memoryview]:
    # Written for the common case: one-byte tags and lengths are read inline (a call per
    # varint would be most of the cost for a small request).
    view = memoryview(data)
    found: dict[int, memoryview] = {}
    end = len(view)
    position = 0
    while position < end:
        key = view[position]
        if key < 0x80:
            position += 1
        else:
            key, position = _varint(view, position, end)
        wire_type = key & 7
        if wire_type == _LENGTH_DELIMITED:
            if position >= end:
                raise MalformedMessageError("a length-delimited field is truncated")
            length = view[position]
            if length < 0x80:
                position += 1
            else:
                length, position = _varint(view, position, end)
            stop = position + length
            if stop > end:
                raise MalformedMessageError("a length-delimited field runs past the end")
            if key >> 3 in wanted:
                found[key >> 3] = view[position:stop]
            position = stop
        elif wire_type == _VARINT:
            _, position = _varint(view, position, end)
        elif wire_type == _FIXED64:
            position += 8
        elif wire_type == _FIXED32:
            position += 4
        else:
            # Groups (3, 4) are proto2's; nothing in these messages is one.
            raise MalformedMessageError(f"wire type {wire_type}")
        if key >> 3 == 0:
            raise MalformedMessageError("field number 0")
        if position > end:
            raise MalformedMessageError("a fixed-size field runs past the end")
    return found


def _varint(view: memoryview, position: int, end: int) -> tuple[int, int]:
    value = 0
    shift = 0
    for index in range(position, min(position + _MAX_VARINT_BYTES, end)):
        byte = view[index]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, index + 1
        shift += 7
    raise MalformedMessageError("a varint is truncated or longer than 10 bytes")


_PARAMETERS = 4
"""``ModelInferRequest.parameters``: a map, on the wire one (key=1, value=2) entry per field 4."""
_BOOL_PARAM = 1
_INT64_PARAM = 2
_STRING_PARAM = 3
_UINT64_PARAM = 5
_SEQUENCE_KEYS: Final = frozenset((b"sequence_id", b"sequence_start", b"sequence_end"))


def sequence_tag(data: bytes | memoryview) -> SequenceTag | None:
    """The sequence a serialized ModelInferRequest belongs to, read from its ``sequence_id``,
    ``sequence_start`` and ``sequence_end`` parameters; None when it names none (no ID, 0 or
    "") or the parameters cannot be read (the worker answers that).

    A request that does not contain the bytes ``sequence_id`` costs one search. An
    ``int64_param`` ID is read as the uint64 of the same bits, as Triton reads it.
    """
    if b"sequence_id" not in data:
        return None
    values: dict[bytes, tuple[int, int | bytes]] = {}
    try:
        for entry in _repeated(data, _PARAMETERS):
            fields = _length_delimited(entry, frozenset((1, 2)))
            key = bytes(fields.get(1, b""))
            value = fields.get(2)
            if key in _SEQUENCE_KEYS and value is not None:
                parsed = _scalar(value)
                if parsed is not None:
                    values[key] = parsed
    except MalformedMessageError:
        return None
    correlation_id: int | str
    kind, raw = values.get(b"sequence_id", (0, 0))
    if kind in (_INT64_PARAM, _UINT64_PARAM) and isinstance(raw, int) and raw:
        correlation_id = raw & _UINT64_MASK
    elif kind == _STRING_PARAM and isinstance(raw, bytes) and raw:
        try:
            correlation_id = raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
    else:
        return None
    return SequenceTag(
        correlation_id,
        is_start=values.get(b"sequence_start") == (_BOOL_PARAM, 1),
        is_end=values.get(b"sequence_end") == (_BOOL_PARAM, 1),
    )


_UINT64_MASK: Final = (1 << 64) - 1


def _scalar(data: memoryview) -> tuple[int, int | bytes] | None:
    # InferParameter is a oneof: its one set field, as (field number, value).
    found: tuple[int, int | bytes] | None = None
    for number, value in _fields(data):
        found = (number, value if isinstance(value, int) else bytes(value))
    return found


def _repeated(data: bytes | memoryview, number: int) -> list[memoryview]:
    # Every occurrence of a length-delimited field (a map's entries), in order.
    return [
        value
        for field, value in _fields(memoryview(data))
        if field == number and isinstance(value, memoryview)
    ]


def _fields(view: memoryview) -> Iterator[tuple[int, int | memoryview]]:
    # Each varint or length-delimited field as (field number, value), in order; fixed-size
    # fields are skipped. (The hot path, _length_delimited, reads its fields inline.)
    end = len(view)
    position = 0
    while position < end:
        key, position = _varint(view, position, end)
        number, wire_type = key >> 3, key & 7
        if wire_type == _VARINT:
            value, position = _varint(view, position, end)
            yield number, value
        elif wire_type == _LENGTH_DELIMITED:
            length, position = _varint(view, position, end)
            stop = position + length
            if stop > end:
                raise MalformedMessageError("a length-delimited field runs past the end")
            yield number, view[position:stop]
            position = stop
        elif wire_type == _FIXED64:
            position += 8
        elif wire_type == _FIXED32:
            position += 4
        else:
            raise MalformedMessageError(f"wire type {wire_type}")
    if position > end:
        raise MalformedMessageError("a fixed-size field runs past the end")
