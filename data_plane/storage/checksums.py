"""Which checksum proves that the bytes fetched are the object, and computing it.

An S3 object may carry several ways to check it; the first that applies wins, cheapest
first (CRC32 runs at about 2.8 GB/s here, SHA-1 1.7, SHA-256 1.0, MD5 only 0.3):

1. a full-object additional checksum (``x-amz-checksum-crc32``/``-sha1``/``-sha256``);
2. a composite additional checksum (value suffixed ``-N``): the checksum of the parts'
   checksums, which needs the upload's part size;
3. the ETag, when it is an MD5 (single-part upload, not SSE-KMS or SSE-C), or the
   multipart ETag (MD5 of the parts' MD5s, ``-N``), which needs the part size;
4. nothing but the size (CRC32C/CRC64NVME without a library, or an opaque ETag).

The part size of a multipart upload is read from ``HEAD ?partNumber=1``; parts are
assumed equal but the last, which every mainstream uploader does. When that does not add up
to the object size, the composite check is skipped rather than failing a good object.
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol

Algorithm = Literal["crc32", "sha1", "sha256", "md5"]

_ADDITIONAL: Final[tuple[tuple[Algorithm, str], ...]] = (
    ("crc32", "ChecksumCRC32"),
    ("sha1", "ChecksumSHA1"),
    ("sha256", "ChecksumSHA256"),
)
_MD5_HEX: Final = re.compile(r"[0-9a-f]{32}")
_MULTIPART_ETAG: Final = re.compile(r"([0-9a-f]{32})-(\d+)")


@dataclass(frozen=True)
class ChecksumPlan:
    """How to check one object: algorithm, expected value, and the parts it spans."""

    algorithm: Algorithm
    expected: str
    """The value as the store spells it: base64 for additional checksums, hex for ETags."""
    part_size: int | None
    """None: over the whole object; else a composite over parts of this size."""
    source: str
    """Where the expected value came from, for error messages (``ETag``, ``x-amz-...``)."""

    def describe(self) -> str:
        kind = "composite " if self.part_size else ""
        return f"{kind}{self.algorithm} ({self.source})"


def plan_checksum(
    head: Mapping[str, Any], *, size: int, part_size: Callable[[], int | None]
) -> ChecksumPlan | None:
    """The best check for an object from its ``HeadObject`` answer, or None (size only).

    ``part_size`` is asked only when a composite check needs the upload's part size.
    """
    etag = str(head.get("ETag", "")).strip('"').lower()
    multipart = _MULTIPART_ETAG.fullmatch(etag)
    etag_parts = int(multipart.group(2)) if multipart else None
    for algorithm, field in _ADDITIONAL:
        value = head.get(field)
        if not value:
            continue
        base, _, suffix = str(value).partition("-")
        checksum_type = head.get("ChecksumType")
        source = f"x-amz-checksum-{algorithm}"
        if not suffix and checksum_type != "COMPOSITE" and etag_parts is None:
            return ChecksumPlan(algorithm, base, None, source)
        if checksum_type == "FULL_OBJECT":
            return ChecksumPlan(algorithm, base, None, source)
        # Composite. Some stores (moto) drop the -N suffix on HEAD; the ETag's count holds.
        parts = int(suffix) if suffix.isdigit() else etag_parts
        uniform = _uniform_part_size(size, parts, part_size)
        if uniform is not None:
            return ChecksumPlan(algorithm, base, uniform, source)
    encrypted = head.get("ServerSideEncryption") in {"aws:kms", "aws:kms:dsse"}
    if encrypted or head.get("SSECustomerAlgorithm"):
        return None  # the ETag of an SSE-KMS or SSE-C object is not an MD5 of its bytes
    if _MD5_HEX.fullmatch(etag):
        return ChecksumPlan("md5", etag, None, "ETag")
    if multipart:
        uniform = _uniform_part_size(size, etag_parts, part_size)
        if uniform is not None:
            return ChecksumPlan("md5", multipart.group(1), uniform, "ETag")
    return None


class _Digest(Protocol):
    def update(self, data: bytes | bytearray | memoryview, /) -> None: ...

    def digest(self) -> bytes: ...


class _Crc32:
    def __init__(self) -> None:
        self._value = 0

    def update(self, data: bytes | bytearray | memoryview, /) -> None:
        self._value = zlib.crc32(data, self._value)

    def digest(self) -> bytes:
        return self._value.to_bytes(4, "big")


def _new_digest(algorithm: Algorithm) -> _Digest:
    if algorithm == "crc32":
        return _Crc32()
    return hashlib.new(algorithm)


class StreamHasher:
    """Feed an object's bytes in order; :meth:`matches` says whether they fit the plan."""

    def __init__(self, plan: ChecksumPlan) -> None:
        self.plan = plan
        self._whole = _new_digest(plan.algorithm)
        self._part = _new_digest(plan.algorithm)
        self._part_filled = 0
        self._part_digests: list[bytes] = []

    def update(self, data: bytes | bytearray | memoryview) -> None:
        part_size = self.plan.part_size
        if part_size is None:
            self._whole.update(data)
            return
        view = memoryview(data)
        while view:
            take = min(len(view), part_size - self._part_filled)
            self._part.update(view[:take])
            self._part_filled += take
            view = view[take:]
            if self._part_filled == part_size:
                self._finish_part()

    def actual(self) -> str:
        """The value computed so far, spelled as :attr:`ChecksumPlan.expected` is."""
        if self.plan.part_size is None:
            raw = self._whole.digest()
        else:
            if self._part_filled:
                self._finish_part()
            combined = _new_digest(self.plan.algorithm)
            for digest in self._part_digests:
                combined.update(digest)
            raw = combined.digest()
        if self.plan.algorithm == "md5":
            return raw.hex()
        return base64.b64encode(raw).decode("ascii")

    def matches(self) -> bool:
        return self.actual() == self.plan.expected

    def _finish_part(self) -> None:
        self._part_digests.append(self._part.digest())
        self._part = _new_digest(self.plan.algorithm)
        self._part_filled = 0


def _uniform_part_size(
    size: int, parts: int | None, part_size: Callable[[], int | None]
) -> int | None:
    if not parts:
        return None
    first = part_size()
    if not first or math.ceil(size / first) != parts:
        return None
    return first
