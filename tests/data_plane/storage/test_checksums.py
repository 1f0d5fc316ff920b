"""Which check an object gets from its HEAD answer, and the hasher's arithmetic."""

from __future__ import annotations

import base64
import hashlib
import os
import zlib
from typing import Any

import pytest

from data_plane.storage.checksums import ChecksumPlan, StreamHasher, plan_checksum

DATA = os.urandom(10_000)
PART = 4096
PARTS = [DATA[i : i + PART] for i in range(0, len(DATA), PART)]


def _crc(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


CRC = _crc(DATA)
CRC_COMPOSITE = _crc(b"".join(zlib.crc32(p).to_bytes(4, "big") for p in PARTS))
MD5 = hashlib.md5(DATA).hexdigest()
MD5_MULTIPART = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in PARTS)).hexdigest()
SHA256 = _b64(hashlib.sha256(DATA).digest())


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        pytest.param(
            {"ETag": f'"{MD5}"', "ChecksumCRC32": CRC},
            ChecksumPlan("crc32", CRC, None, "x-amz-checksum-crc32"),
            id="full-crc32-wins",
        ),
        pytest.param(
            {"ETag": f'"{MD5}"', "ChecksumSHA256": SHA256, "ChecksumType": "FULL_OBJECT"},
            ChecksumPlan("sha256", SHA256, None, "x-amz-checksum-sha256"),
            id="sha256",
        ),
        pytest.param(
            {"ETag": f'"{MD5_MULTIPART}-3"', "ChecksumCRC32": f"{CRC_COMPOSITE}-3"},
            ChecksumPlan("crc32", CRC_COMPOSITE, PART, "x-amz-checksum-crc32"),
            id="composite-crc32",
        ),
        pytest.param(
            # moto answers HEAD without the -N suffix and without ChecksumType.
            {"ETag": f'"{MD5_MULTIPART}-3"', "ChecksumCRC32": CRC_COMPOSITE},
            ChecksumPlan("crc32", CRC_COMPOSITE, PART, "x-amz-checksum-crc32"),
            id="composite-without-suffix",
        ),
        pytest.param(
            {"ETag": f'"{MD5_MULTIPART}-3"', "ChecksumCRC32": CRC, "ChecksumType": "FULL_OBJECT"},
            ChecksumPlan("crc32", CRC, None, "x-amz-checksum-crc32"),
            id="full-object-multipart",
        ),
        pytest.param({"ETag": f'"{MD5}"'}, ChecksumPlan("md5", MD5, None, "ETag"), id="md5-etag"),
        pytest.param(
            {"ETag": f'"{MD5_MULTIPART}-3"'},
            ChecksumPlan("md5", MD5_MULTIPART, PART, "ETag"),
            id="multipart-etag",
        ),
        pytest.param({"ETag": f'"{MD5}"', "ServerSideEncryption": "aws:kms"}, None, id="kms"),
        pytest.param({"ETag": f'"{MD5}"', "SSECustomerAlgorithm": "AES256"}, None, id="sse-c"),
        pytest.param({"ETag": '"opaque-etag"'}, None, id="opaque"),
        pytest.param(
            {"ETag": f'"{MD5}"', "ChecksumCRC32C": "AAAAAA=="},
            ChecksumPlan("md5", MD5, None, "ETag"),
            id="crc32c-falls-back",
        ),
    ],
)
def test_plan_and_verify(head: dict[str, Any], expected: ChecksumPlan | None) -> None:
    plan = plan_checksum(head, size=len(DATA), part_size=lambda: PART)
    assert plan == expected
    if plan is not None:
        hasher = StreamHasher(plan)
        for start in range(0, len(DATA), 1000):  # chunks that straddle part boundaries
            hasher.update(DATA[start : start + 1000])
        assert hasher.matches(), plan
        damaged = StreamHasher(plan)
        damaged.update(b"\x00" + DATA[1:])
        assert not damaged.matches()


def test_composite_needs_a_part_size_that_adds_up() -> None:
    head = {"ETag": f'"{MD5_MULTIPART}-3"'}
    assert plan_checksum(head, size=len(DATA), part_size=lambda: 1000) is None
    assert plan_checksum(head, size=len(DATA), part_size=lambda: None) is None
