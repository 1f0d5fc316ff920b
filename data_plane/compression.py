"""HTTP body compression for ``/infer``, as Triton does it (``shared/research/triton.md`` §1.8).

Requests may carry ``Content-Encoding: gzip`` or ``deflate``; responses are compressed with the
best-weighted of ``gzip``/``deflate``/``identity`` in ``Accept-Encoding``. Decompression is
always bounded, so a small compressed body cannot expand past the input size limit, takes time
linear in the body, and runs off the event loop (`decode_body_off_loop`).
"""

from __future__ import annotations

import asyncio
import functools
import re
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Final

from data_plane.errors import InvalidArgumentError, UnsupportedCompressionError

__all__ = [
    "MAX_GZIP_MEMBERS",
    "choose_response_encoding",
    "decode_body",
    "decode_body_off_loop",
    "encode_body",
]

_GZIP_OR_ZLIB: Final = 32 + zlib.MAX_WBITS  # either header, detected as Triton's inflate does
_RAW_DEFLATE: Final = -zlib.MAX_WBITS
_GZIP: Final = 16 + zlib.MAX_WBITS
_LEADING_FLOAT: Final = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_INPUT_SLICE: Final = 16 * 1024

MAX_GZIP_MEMBERS: Final = 1024
"""Concatenated gzip members one body may hold (RFC 1952 allows several, ``cat a.gz b.gz``
makes them; Triton reads only the first). Each costs a fresh inflater, so a body of tiny
members is refused rather than inflated member by member."""

# Its own threads, not asyncio's default executor: a burst of compressed bodies must not queue
# model loads behind it. zlib lets go of the GIL while it inflates, so two threads run beside
# the event loop; threads start only on first use.
_INFLATERS: Final = ThreadPoolExecutor(max_workers=2, thread_name_prefix="zeroserve-inflate")


def decode_body(body: bytes, content_encoding: str | None, *, max_bytes: int) -> bytes:
    """Undo the request's ``Content-Encoding``; never produces more than ``max_bytes``.

    ``gzip`` and ``deflate`` each accept a gzip or zlib stream (like Triton's inflate) and
    ``deflate`` also raw DEFLATE, which some clients send; ``identity`` or none returns ``body``
    as is (its size is the transport's to bound). Anything else raises
    `UnsupportedCompressionError` (the answer advertises ``Accept-Encoding: gzip, deflate``);
    oversized or corrupt data raises `InvalidArgumentError`.
    """
    encoding = (content_encoding or "").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise UnsupportedCompressionError(encoding=encoding)
    if not body:
        raise InvalidArgumentError("nothing to be decompressed")
    try:
        try:
            return _inflate(body, _GZIP_OR_ZLIB, encoding, max_bytes)
        except zlib.error:
            if encoding == "gzip":
                raise
        return _inflate(body, _RAW_DEFLATE, encoding, max_bytes)  # some clients send raw
    except zlib.error as exc:
        raise InvalidArgumentError(
            f"failed to decompress the request body ({encoding}): {exc}"
        ) from None


async def decode_body_off_loop(
    body: bytes, content_encoding: str | None, *, max_bytes: int
) -> bytes:
    """`decode_body` on a worker thread: inflating up to ``max_bytes`` (64 MiB by default)
    takes long enough to stall every other request and the health probes on the event loop.
    Bodies without an encoding are returned at once."""
    if content_encoding is None or content_encoding.strip().lower() in ("", "identity"):
        return body
    return await asyncio.get_running_loop().run_in_executor(
        _INFLATERS, functools.partial(decode_body, body, content_encoding, max_bytes=max_bytes)
    )


def _inflate(body: bytes, wbits: int, encoding: str, max_bytes: int) -> bytes:
    """Inflate at most ``max_bytes``; raises zlib.error for data that is not a stream."""
    parts: list[bytes] = []
    produced = 0
    view = memoryview(body)
    inflater = zlib.decompressobj(wbits)
    members = 1
    # Input goes in bounded slices: at a member's end zlib copies the rest of what it was
    # given into ``unused_data``, so handing it the whole body made many small members cost
    # the square of the body's size.
    for start in range(0, len(body), _INPUT_SLICE):
        pending: bytes | memoryview = view[start : start + _INPUT_SLICE]
        while pending:
            if inflater.eof:
                members += 1
                if members > MAX_GZIP_MEMBERS:
                    raise InvalidArgumentError(
                        f"failed to decompress the request body ({encoding}): more than "
                        f"{MAX_GZIP_MEMBERS} concatenated members"
                    )
                inflater = zlib.decompressobj(wbits)
            part = inflater.decompress(pending, max_bytes - produced + 1)
            produced += len(part)
            if produced > max_bytes:
                raise InvalidArgumentError(
                    "Decompressed data size exceeds the maximum allowed value of "
                    f"{max_bytes} bytes. Use --http-max-input-size to increase the limit."
                )
            if part:
                parts.append(part)
            # Past a member's end the rest is the next member's; otherwise what the output
            # bound left unread (none once the slice is used up).
            pending = inflater.unused_data if inflater.eof else inflater.unconsumed_tail
    if not inflater.eof:
        raise InvalidArgumentError(
            f"failed to decompress the request body ({encoding}): truncated data"
        )
    return parts[0] if len(parts) == 1 else b"".join(parts)


def choose_response_encoding(accept_encoding: str | None) -> str | None:
    """Pick ``"gzip"``, ``"deflate"`` or None (identity) from ``Accept-Encoding``.

    Mirrors Triton's ``CompressionTypeUsed``: the highest ``;q=`` weight wins, the first listed
    on a tie; weight 0 or unparsable entries are skipped; ``*`` is not understood.
    """
    if not accept_encoding:
        return None
    chosen, best = "identity", 0.0
    for item in accept_encoding.split(","):
        coding, _, weight_text = item.lstrip(" ").partition(";q=")
        weight = 1.0
        if weight_text:
            match = _LEADING_FLOAT.match(weight_text)
            if match is None:
                continue
            weight = float(match.group(0))
        if coding in ("identity", "deflate", "gzip") and weight > best:
            chosen, best = coding, weight
    return None if chosen == "identity" else chosen


def encode_body(body: bytes, encoding: str, *, level: int = 6) -> bytes:
    """Compress a response body for ``Content-Encoding: gzip`` or ``deflate`` (zlib-wrapped).

    ``level`` defaults to zlib's default, which Triton uses; the gzip header carries no
    timestamp, so equal bodies compress to equal bytes. Other encodings raise ValueError.
    """
    if encoding == "gzip":
        wbits = _GZIP
    elif encoding == "deflate":
        wbits = zlib.MAX_WBITS
    else:
        raise ValueError(f"cannot encode a body as {encoding!r}")
    compressor = zlib.compressobj(level, zlib.DEFLATED, wbits)
    return compressor.compress(body) + compressor.flush()
