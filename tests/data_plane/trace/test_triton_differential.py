"""Trace and logging settings against real Triton 2.51: the same HTTP requests, in the same
order, to Triton and to zeroserve, each started with a trace file; the same status codes and
bodies (the trace file's path aside), and traces of the same shape. Skips visibly where
Triton cannot run (see tests/triton_oracle.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.data_plane.trace.traced_app import traced_data_plane
from tests.models import read_config, write_onnx_add_sub
from tests.triton_oracle import ADD_SUB_MODEL, TritonServer, triton_for, write_python_backend_model

pytestmark = pytest.mark.anyio

SERVER = "/v2/trace/setting"
MODEL = "/v2/models/simple/trace/setting"
UNKNOWN = "/v2/models/nosuch/trace/setting"
CLEAR_ALL = {"trace_level": None, "trace_rate": None, "trace_count": None, "log_frequency": None}
STAMPS = {
    "REQUEST_START",
    "QUEUE_START",
    "COMPUTE_START",
    "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START",
    "COMPUTE_END",
    "REQUEST_END",
}
INFER_BODY = {
    "inputs": [
        {"name": name, "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4.5]}
        for name in ("INPUT0", "INPUT1")
    ]
}

Request = tuple[str, str, Any]
"""(method, path, body): a body of bytes goes as it is, anything else as JSON."""


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # module scope: one pair of servers for the module


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    zeroserve_repo = tmp_path_factory.mktemp("zeroserve-repo")
    triton_repo = tmp_path_factory.mktemp("triton-repo")
    model_dir = write_onnx_add_sub(zeroserve_repo, "simple", dims=(4,), max_batch_size=8)
    write_python_backend_model(triton_repo, read_config(model_dir), ADD_SUB_MODEL)
    return zeroserve_repo, triton_repo


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("traces")


@pytest.fixture(scope="module")
def triton(repos: tuple[Path, Path], traces: Path) -> Iterator[TritonServer]:
    file = traces / "triton.json"
    with triton_for(repos[1], traces, f"--trace-config=triton,file={file}") as server:
        yield server


@pytest.fixture(scope="module")
async def pair(
    triton: TritonServer, repos: tuple[Path, Path], traces: Path, tmp_path_factory
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    cache = tmp_path_factory.mktemp("cache")
    file = str(traces / "zeroserve.json")
    async with (
        httpx.AsyncClient(base_url=triton.http_url, timeout=60.0) as triton_client,
        traced_data_plane(repos[0], cache, trace_file=file) as zeroserve_client,
    ):
        yield triton_client, zeroserve_client


@pytest.fixture
async def clients(
    pair: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    """Both servers, their trace and logging settings back at the start values after."""
    yield pair
    for client in pair:
        for path in (MODEL, SERVER):
            answer = await send(client, ("POST", path, CLEAR_ALL))
            assert answer.status_code == 200, answer.text
        await send(client, ("POST", "/v2/logging", LOGGING_START))


LOGGING_START = {
    "log_info": True,
    "log_warning": True,
    "log_error": True,
    "log_verbose_level": 0,
    "log_format": "default",
}


async def send(client: httpx.AsyncClient, request: Request) -> httpx.Response:
    method, path, body = request
    if method == "GET":
        return await client.get(path)
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return await client.post(path, content=content)


def comparable(answer: httpx.Response) -> tuple[int, Any]:
    """The status and the body, the servers' own trace file names made equal and RapidJSON's
    parse error details (which zeroserve's JSON reader words its own way) cut off."""
    body = answer.json()
    if isinstance(body, dict):
        if body.get("trace_file"):
            body["trace_file"] = "<file>"
        error = body.get("error", "")
        prefix = "failed to parse the request JSON buffer: "
        if error.startswith(prefix) and "document is empty" not in error:
            body["error"] = prefix
    return answer.status_code, body


async def check_same(clients: tuple[httpx.AsyncClient, httpx.AsyncClient], *requests: Request):
    """Send ``requests`` in order to both; every answer must match."""
    triton, zeroserve = clients
    for request in requests:
        expected = comparable(await send(triton, request))
        actual = comparable(await send(zeroserve, request))
        assert actual == expected, request


BAD_BODIES = [
    {"trace_level": "TIMESTAMPS"},
    {"trace_level": [5]},
    {"trace_level": ["OFF", "TIMESTAMPS"]},
    {"trace_level": ["TIMESTAMPS"], "trace_rate": "0"},
    {"trace_level": ["TIMESTAMPS"], "trace_count": "0"},
    {"trace_rate": 5},
    {"trace_rate": True},
    {"trace_rate": "abc"},
    {"trace_rate": ""},
    {"trace_rate": "99999999999"},
    {"trace_rate": "2147483648"},
    {"trace_count": 3},
    {"trace_count": "-2"},
    {"trace_count": "z"},
    {"trace_count": "99999999999"},
    {"log_frequency": 2},
    {"log_frequency": "z"},
    {"log_frequency": "99999999999"},
    {"trace_file": "/tmp/elsewhere.json"},
    {"trace_file": None},
    b"not json",
    b"",
]


@pytest.mark.parametrize("path", [SERVER, MODEL])
@pytest.mark.parametrize("body", BAD_BODIES, ids=[str(b) for b in BAD_BODIES])
async def test_bad_trace_bodies(clients, path: str, body: Any):
    await check_same(clients, ("POST", path, body), ("GET", path, None))


async def test_reading_and_lenient_values(clients):
    await check_same(
        clients,
        ("GET", SERVER, None),
        ("GET", MODEL, None),
        ("GET", UNKNOWN, None),
        ("POST", UNKNOWN, b"not json"),
        ("POST", SERVER, {}),
        ("POST", SERVER, [1]),
        ("POST", SERVER, {"bogus": "1", "trace_mode": "opentelemetry"}),
        ("POST", SERVER, {"trace_rate": "-1"}),
        ("POST", SERVER, {"trace_rate": "1.5"}),
        ("POST", SERVER, {"trace_rate": " 5"}),
        ("POST", SERVER, {"trace_rate": "5x"}),
        ("POST", SERVER, {"trace_rate": "+7"}),
        ("POST", SERVER, {"log_frequency": "-1"}),
        ("POST", SERVER, {"trace_count": "-1.9"}),
        ("POST", SERVER, {"trace_level": ["BOGUS"]}),
        ("POST", SERVER, {"trace_level": []}),
    )


async def test_levels(clients):
    await check_same(
        clients,
        ("POST", SERVER, {"trace_level": ["TIMESTAMPS"]}),
        ("POST", SERVER, {"trace_level": ["TENSORS", "TIMESTAMPS"]}),
        ("POST", SERVER, {"trace_level": ["TIMESTAMPS", "BOGUS"]}),
        ("POST", SERVER, {"trace_level": ["BOGUS"]}),
        ("POST", SERVER, {"trace_level": ["TIMESTAMPS", "OFF"]}),
        ("POST", SERVER, {"trace_level": ["OFF"]}),
        ("POST", SERVER, {"trace_rate": "0"}),
        ("POST", SERVER, {"trace_level": ["TIMESTAMPS"]}),
    )


async def test_model_settings_override_and_fall_back(clients):
    await check_same(
        clients,
        ("POST", MODEL, {"trace_rate": "7"}),
        ("POST", SERVER, {"trace_rate": "3", "trace_count": "10"}),
        ("GET", MODEL, None),
        ("GET", SERVER, None),
        ("POST", MODEL, {"trace_rate": None}),
        ("POST", MODEL, {"trace_level": ["OFF"]}),
        ("POST", SERVER, {"trace_level": ["TIMESTAMPS"]}),
        ("GET", MODEL, None),
        ("POST", MODEL, {"trace_level": None}),
        ("POST", SERVER, CLEAR_ALL),
        ("GET", MODEL, None),
        ("POST", MODEL, {"trace_level": ["TIMESTAMPS"], "log_frequency": "4"}),
        ("POST", SERVER, {"log_frequency": "2", "trace_count": "7"}),
        ("GET", MODEL, None),
        ("POST", MODEL, CLEAR_ALL),
        ("GET", MODEL, None),
    )


async def test_count_runs_down_with_inferences(clients):
    infer = ("POST", "/v2/models/simple/infer", INFER_BODY)
    await check_same(
        clients,
        ("POST", MODEL, {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "2"}),
        infer,
        ("GET", MODEL, None),
        infer,
        infer,
        ("GET", MODEL, None),
        ("POST", MODEL, {"trace_rate": "2"}),
        ("POST", MODEL, {"trace_count": "-1"}),
    )


def numbered(folder: Path, stem: str) -> set[Path]:
    return set(folder.glob(f"{stem}.json.*"))


def read_whole(path: Path) -> list[dict[str, Any]] | None:
    """The entries in ``path``; None while it is still being written."""
    try:
        loaded: list[dict[str, Any]] = json.loads(path.read_text())
    except ValueError:
        return None
    return loaded


async def new_trace(folder: Path, stem: str, before: set[Path]) -> list[dict[str, Any]]:
    """The entries of the one ``<stem>.json.<n>`` not in ``before``, once it is whole (Triton
    writes it as the trace ends, zeroserve's writer thread just after)."""
    async with asyncio.timeout(10):
        while True:
            new = numbered(folder, stem) - before
            if new:
                (path,) = new
                found = read_whole(path)
                if found is not None:
                    return found
            await asyncio.sleep(0.05)


async def test_traces_have_tritons_shape(clients, traces: Path):
    """One traced inference on each, level TIMESTAMPS and TENSORS, count 1: each server
    writes it to its next numbered file at once."""
    setting = {"trace_level": ["TIMESTAMPS", "TENSORS"], "trace_rate": "1", "trace_count": "1"}
    body = {**INFER_BODY, "id": "traced"}
    before = {name: numbered(traces, name) for name in ("triton", "zeroserve")}
    await check_same(clients, ("POST", SERVER, setting), ("POST", "/v2/models/simple/infer", body))
    written = {name: await new_trace(traces, name, before[name]) for name in before}
    triton, zeroserve = written["triton"], written["zeroserve"]

    def head(trace: list[dict[str, Any]]) -> dict[str, Any]:
        (found,) = [{k: v for k, v in e.items() if k != "id"} for e in trace if "model_name" in e]
        return found

    assert (
        head(zeroserve)
        == head(triton)
        == {
            "model_name": "simple",
            "model_version": 1,
            "request_id": "traced",
        }
    )

    def stamps_in_time_order(trace: list[dict[str, Any]]) -> list[str]:
        stamps = [e["timestamps"][0] for e in trace if "timestamps" in e]
        return [s["name"] for s in sorted(stamps, key=lambda s: s["ns"]) if s["name"] in STAMPS]

    assert stamps_in_time_order(zeroserve) == stamps_in_time_order(triton)
    assert len(stamps_in_time_order(zeroserve)) == len(STAMPS)

    def tensors(trace: list[dict[str, Any]]) -> list[str]:
        return sorted(
            json.dumps({k: v for k, v in e.items() if k != "id"}, sort_keys=True)
            for e in trace
            if "activity" in e
        )

    assert tensors(zeroserve) == tensors(triton)
    assert len(tensors(zeroserve)) == 4  # two inputs queued, two outputs


LOGGING_BAD = [
    {"log_file": "x"},
    {"log_file": 5},
    {"log_info": "false"},
    {"log_info": 0},
    {"log_warning": "x"},
    {"log_error": 1},
    {"log_verbose_level": -1},
    {"log_verbose_level": "1"},
    {"log_verbose_level": 1.5},
    {"log_verbose_level": 2**64},
    {"log_format": "iso8601"},
    {"log_format": 5},
    b"nope",
    b"",
]


@pytest.mark.parametrize("body", LOGGING_BAD, ids=[str(b) for b in LOGGING_BAD])
async def test_bad_logging_bodies(clients, body: Any):
    await check_same(
        clients,
        ("POST", "/v2/logging", LOGGING_START),
        ("POST", "/v2/logging", body),
        ("GET", "/v2/logging", None),
    )


async def test_logging_settings(clients):
    await check_same(
        clients,
        ("POST", "/v2/logging", LOGGING_START),
        ("POST", "/v2/logging", {}),
        ("POST", "/v2/logging", [1]),
        ("POST", "/v2/logging", {"log_file": None, "bogus": 1}),
        ("POST", "/v2/logging", {"log_info": False, "log_warning": None}),
        ("POST", "/v2/logging", {"log_verbose_level": 3}),
        ("POST", "/v2/logging", {"log_verbose_level": 2**40}),
        ("POST", "/v2/logging", {"log_verbose_level": 2**31}),
        ("POST", "/v2/logging", {"log_verbose_level": 2**31 - 1}),
        ("POST", "/v2/logging", {"log_verbose_level": 2**32 + 5}),
        ("POST", "/v2/logging", {"log_verbose_level": 0}),
        ("POST", "/v2/logging", {"log_format": "ISO8601"}),
        ("POST", "/v2/logging", {"log_warning": False, "log_format": "bad"}),
        ("GET", "/v2/logging", None),
        ("POST", "/v2/logging", {"log_error": False, "log_info": "x"}),
        ("GET", "/v2/logging", None),
    )


async def test_other_methods(clients):
    for path in (SERVER, MODEL, "/v2/logging"):
        triton, zeroserve = clients
        expected = await triton.put(path)
        actual = await zeroserve.put(path)
        assert (actual.status_code, actual.json()) == (expected.status_code, expected.json())
