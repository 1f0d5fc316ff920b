"""Shared-memory requests and the answers Triton 2.51 gives them, shared by the in-process
tests (which expect these answers from zeroserve) and the differential tests (which get
them from both servers).

Register cases run against a fresh 128-byte object whose key replaces ``KEY``. Infer cases run
against the ``simple`` model (INT32 ``[-1, 16]`` add and subtract) with regions ``in`` (128
bytes: two ``[1, 16]`` INT32 tensors), ``out`` (128 bytes) and ``small`` (32 bytes)
registered. ``triton`` is set where zeroserve answers otherwise on purpose: Triton's answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import pytest

from tests.data_plane.shared_memory.requests import shm_input, shm_output

KEY: Final = "/<key>"
"""Stands for the key of the object a register case runs against."""

NOT_STRING: Final = "attempt to access JSON non-string as string"
NOT_UINT: Final = "attempt to access JSON non-unsigned-integer as unsigned-integer"
NO_KEY: Final = "Shared memory register request has no 'key' field"
INVALID_ARGS: Final = "failed to register shared memory region 'r': invalid args"
UNMAPPABLE: Final = (
    "failed to register shared memory region 'r': unable to process address spaceInvalid argument"
)
BAD_HANDLE: Final = "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t"


@dataclass(frozen=True)
class Case:
    """One request, the status and error text expected for it (None: success, no error),
    and Triton's own answer where zeroserve differs on purpose (why: ``note``)."""

    id: str
    body: Any
    status: int
    message: str | None
    triton: tuple[int, str | None] | None = None
    note: str = ""


def params(cases: list[Case]) -> list[Any]:
    return [pytest.param(case, id=case.id) for case in cases]


def _open_error(key: str) -> str:
    return f"Unable to open shared memory region: '{key}'"


REGISTER_CASES = [
    Case("no-key", {"offset": 0, "byte_size": 8}, 400, NO_KEY),
    Case("not-an-object", [1, 2], 400, NO_KEY),
    Case(
        "no-byte-size",
        {"key": KEY, "offset": 0},
        400,
        "Shared memory register request has no 'byte_size' field",
    ),
    Case("key-int", {"key": 5, "byte_size": 8}, 500, NOT_STRING),
    Case("key-null", {"key": None, "byte_size": 8}, 500, NOT_STRING),
    Case("offset-negative", {"key": KEY, "offset": -1, "byte_size": 8}, 500, NOT_UINT),
    Case("offset-string", {"key": KEY, "offset": "0", "byte_size": 8}, 500, NOT_UINT),
    Case("byte-size-bool", {"key": KEY, "byte_size": True}, 500, NOT_UINT),
    Case("byte-size-float", {"key": KEY, "byte_size": 1.5}, 500, NOT_UINT),
    Case("byte-size-past-uint64", {"key": KEY, "byte_size": 2**64}, 500, NOT_UINT),
    Case("larger-than-object", {"key": KEY, "byte_size": 129}, 400, INVALID_ARGS),
    Case("offset-past-end", {"key": KEY, "offset": 200, "byte_size": 8}, 400, INVALID_ARGS),
    Case("window-past-end", {"key": KEY, "offset": 64, "byte_size": 65}, 400, INVALID_ARGS),
    Case("uint64-max", {"key": KEY, "byte_size": 2**64 - 1}, 400, INVALID_ARGS),
    Case(
        "missing-key",
        {"key": "/zs-no-such-key", "byte_size": 8},
        500,
        _open_error("/zs-no-such-key"),
    ),
    Case(
        "traversal", {"key": "/../etc/passwd", "byte_size": 8}, 500, _open_error("/../etc/passwd")
    ),
    Case("path-outside", {"key": "/etc/passwd", "byte_size": 8}, 500, _open_error("/etc/passwd")),
    Case("empty-key", {"key": "", "byte_size": 8}, 500, _open_error("")),
    Case("root-key", {"key": "/", "byte_size": 8}, 500, _open_error("/")),
    Case("whole-object", {"key": KEY, "offset": 0, "byte_size": 128}, 200, None),
    Case("no-offset", {"key": KEY, "byte_size": 8}, 200, None),
    Case("extra-member", {"key": KEY, "byte_size": 8, "other": 1}, 200, None),
    Case("key-without-slash", {"key": KEY.lstrip("/"), "byte_size": 8}, 200, None),
    Case(
        "unaligned-offset",
        {"key": KEY, "offset": 64, "byte_size": 64},
        200,
        None,
        triton=(400, UNMAPPABLE),
        note="Triton maps from the offset, which mmap needs page-aligned; we read by offset",
    ),
    Case(
        "last-byte",
        {"key": KEY, "offset": 127, "byte_size": 1},
        200,
        None,
        triton=(400, UNMAPPABLE),
        note="as unaligned-offset",
    ),
]


def _pair(region: str = "in") -> list[dict[str, Any]]:
    return [shm_input("INPUT0", region, 0, 64), shm_input("INPUT1", region, 64, 64)]


def _first(entry: dict[str, Any]) -> list[dict[str, Any]]:
    return [entry, shm_input("INPUT1", "in", 64, 64)]


def _where(what: str, region: str) -> str:
    return f"Invalid {what} for shared memory region: '{region}'"


def _mismatch(request_id: str, got: int) -> str:
    return (
        f"[request id: {request_id}] input byte size mismatch for input 'INPUT0' for model "
        f"'simple'. Expected 64, got {got}"
    )


INFER_CASES = [
    Case("good", {"inputs": _pair(), "outputs": [shm_output("OUTPUT0", "out", 0, 64)]}, 200, None),
    Case(
        "unknown-input-region",
        {"inputs": _first(shm_input("INPUT0", "zz", 0, 64))},
        404,
        "Unable to find shared memory region: 'zz'",
    ),
    Case(
        "unknown-output-region",
        {"inputs": _pair(), "outputs": [shm_output("OUTPUT0", "zz", 0, 64)]},
        404,
        "Unable to find shared memory region: 'zz'",
    ),
    Case(
        "input-offset-at-end",
        {"inputs": _first(shm_input("INPUT0", "in", 128, 0))},
        400,
        _where("offset", "in"),
    ),
    Case(
        "input-offset-past-end",
        {"inputs": _first(shm_input("INPUT0", "in", 200, 64))},
        400,
        _where("offset", "in"),
    ),
    Case(
        "input-past-end",
        {"inputs": _first(shm_input("INPUT0", "in", 100, 64))},
        400,
        _where("offset + byte size", "in"),
    ),
    Case(
        "input-no-byte-size",
        {"inputs": _first(shm_input("INPUT0", "in", 0, None))},
        400,
        _where("offset + byte size", "in"),
    ),
    Case(
        "input-in-too-small-region",
        {"inputs": _first(shm_input("INPUT0", "small", 0, 64))},
        400,
        _where("offset + byte size", "small"),
    ),
    Case(
        "input-size-mismatch",
        {"inputs": _first(shm_input("INPUT0", "in", 0, 60))},
        400,
        _mismatch("<id_unknown>", 60),
    ),
    Case(
        "input-size-too-large",
        {"id": "q", "inputs": _first(shm_input("INPUT0", "in", 0, 128))},
        400,
        _mismatch("q", 128),
    ),
    Case(
        "input-data-too",
        {"inputs": _first({**shm_input("INPUT0", "in", 0, 64), "data": [0] * 16})},
        400,
        "Input must set only one of the following fields: 'data', 'binary_data_size' in "
        "'parameters', 'shared_memory_region' in 'parameters'. But set 'data' "
        "'shared_memory_region'",
    ),
    Case(
        "input-region-int",
        {"inputs": _first(shm_input("INPUT0", 5, 0, 64))},
        500,
        f"Unable to parse 'shared_memory_region': {NOT_STRING}",
    ),
    Case(
        "input-offset-negative",
        {"inputs": _first(shm_input("INPUT0", "in", -1, 64))},
        500,
        f"Unable to parse 'shared_memory_offset': {NOT_UINT}",
    ),
    Case(
        "output-region-too-small",
        {"inputs": _pair(), "outputs": [shm_output("OUTPUT0", "small", 0, 32)]},
        500,
        "shared memory size specified with the request for output 'OUTPUT0' (32 bytes) should "
        "be at least 64 bytes to hold the results",
    ),
    Case(
        "output-larger-than-region",
        {"inputs": _pair(), "outputs": [shm_output("OUTPUT0", "small", 0, 64)]},
        400,
        _where("offset + byte size", "small"),
    ),
    Case(
        "output-past-end",
        {"inputs": _pair(), "outputs": [shm_output("OUTPUT0", "out", 100, 64)]},
        400,
        _where("offset + byte size", "out"),
    ),
    Case(
        "output-offset-at-end",
        {"inputs": _pair(), "outputs": [shm_output("OUTPUT0", "out", 128, 64)]},
        400,
        _where("offset", "out"),
    ),
    Case(
        "output-no-byte-size",
        {"inputs": _pair(), "outputs": [shm_output("OUTPUT0", "out", 0, None)]},
        400,
        _where("offset + byte size", "out"),
    ),
    Case(
        "output-binary-too",
        {"inputs": _pair(), "outputs": [shm_output("OUTPUT0", "out", 0, 64, binary_data=True)]},
        400,
        "Output can't set both 'shared_memory_region' and 'binary_data'",
    ),
    Case(
        "output-binary-false",
        {"inputs": _pair(), "outputs": [shm_output("OUTPUT0", "out", 0, 64, binary_data=False)]},
        200,
        None,
    ),
    Case(
        "output-classification-too",
        {"inputs": _pair(), "outputs": [shm_output("OUTPUT0", "out", 0, 64, classification=2)]},
        400,
        "Output can't set both 'shared_memory_region' and 'classification'",
    ),
    Case(
        "output-byte-size-string",
        {"inputs": _pair(), "outputs": [shm_output("OUTPUT0", "out", 0, "64")]},
        500,
        f"Unable to parse 'shared_memory_byte_size': {NOT_UINT}",
    ),
    Case(
        "output-region-larger-than-needed",
        {"inputs": _pair(), "outputs": [shm_output("OUTPUT0", "out", 0, 128)]},
        200,
        None,
    ),
    Case(
        "outputs-overlapping",
        {
            "inputs": _pair(),
            "outputs": [shm_output("OUTPUT0", "out", 0, 64), shm_output("OUTPUT1", "out", 0, 64)],
        },
        200,
        None,
    ),
    Case(
        "binary-data-output",
        {
            "inputs": _pair(),
            "outputs": [shm_output("OUTPUT0", "out", 0, 64)],
            "parameters": {"binary_data_output": True},
        },
        200,
        None,
    ),
]

CUDA_CASES = [
    Case("status", ("GET", "/v2/cudasharedmemory/status", None), 200, None),
    Case(
        "region-status",
        ("GET", "/v2/cudasharedmemory/region/x/status", None),
        404,
        "Unable to find cuda shared memory region: 'x'",
    ),
    Case(
        "short-handle",
        (
            "POST",
            "/v2/cudasharedmemory/region/x/register",
            {"raw_handle": {"b64": "AAAA"}, "device_id": 0, "byte_size": 8},
        ),
        400,
        BAD_HANDLE,
    ),
    Case(
        "bad-base64",
        (
            "POST",
            "/v2/cudasharedmemory/region/x/register",
            {"raw_handle": {"b64": "!!"}, "device_id": 0, "byte_size": 8},
        ),
        400,
        BAD_HANDLE,
    ),
    Case(
        "no-handle",
        ("POST", "/v2/cudasharedmemory/region/x/register", {"device_id": 0, "byte_size": 8}),
        400,
        "Shared memory register request has no 'raw_handle' field",
    ),
    Case(
        "handle-not-object",
        (
            "POST",
            "/v2/cudasharedmemory/region/x/register",
            {"raw_handle": "x", "device_id": 0, "byte_size": 8},
        ),
        500,
        "attempt to access non-existing object member 'b64'",
    ),
    Case(
        "no-device",
        (
            "POST",
            "/v2/cudasharedmemory/region/x/register",
            {"raw_handle": {"b64": "AAAA"}, "byte_size": 8},
        ),
        500,
        "attempt to access non-existing object member 'device_id'",
    ),
    Case(
        "handle-of-64-bytes",
        (
            "POST",
            "/v2/cudasharedmemory/region/x/register",
            {"raw_handle": {"b64": "A" * 86 + "=="}, "device_id": 0, "byte_size": 8},
        ),
        400,
        "failed to register shared memory region: invalid args "
        "(this server has no CUDA runtime to open CUDA IPC handles with)",
        triton=(400, "failed to register shared memory region: invalid args"),
        note="the same answer, saying why",
    ),
    Case("unregister", ("POST", "/v2/cudasharedmemory/region/x/unregister", None), 200, None),
    Case("unregister-all", ("POST", "/v2/cudasharedmemory/unregister", None), 200, None),
    Case(
        "register-get",
        ("GET", "/v2/cudasharedmemory/region/x/register", None),
        405,
        "Method Not Allowed",
    ),
]
