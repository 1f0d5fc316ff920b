"""``/v2/trace/setting``, ``/v2/models/{name}/trace/setting`` and ``/v2/logging`` through
the data plane's HTTP app in process: answers and texts as Triton 2.51 gives them (the
differential test compares with the real server), and real inferences traced to the file."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.data_plane.trace.traced_app import traced_data_plane
from tests.models import write_onnx_add_sub, write_onnx_identity

pytestmark = pytest.mark.anyio

STAMPS = [
    "REQUEST_START",
    "QUEUE_START",
    "COMPUTE_START",
    "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START",
    "COMPUTE_END",
    "REQUEST_END",
]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    write_onnx_add_sub(root, "simple", dims=(4,), max_batch_size=8)
    write_onnx_identity(root, "other", datatype="FP32", dims=(4,))
    return root


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    return tmp_path / "trace.json"


@pytest.fixture
async def client(repo: Path, tmp_path: Path, trace_file: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with traced_data_plane(repo, tmp_path / "cache", trace_file=str(trace_file)) as client:
        yield client


def defaults(trace_file: Path | str) -> dict[str, Any]:
    return {
        "trace_level": ["OFF"],
        "trace_rate": "1000",
        "trace_count": "-1",
        "log_frequency": "0",
        "trace_file": str(trace_file),
        "trace_mode": "triton",
    }


async def post(client: httpx.AsyncClient, path: str, body: Any) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return await client.post(path, content=content)


async def infer(client: httpx.AsyncClient, model: str = "simple", request_id: str = "") -> None:
    body: dict[str, Any] = {
        "inputs": [
            {"name": name, "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}
            for name in (("INPUT0", "INPUT1") if model == "simple" else ("INPUT0",))
        ]
    }
    if request_id:
        body["id"] = request_id
    answer = await client.post(f"/v2/models/{model}/infer", json=body)
    assert answer.status_code == 200, answer.text


def read(path: Path) -> Any:
    return json.loads(path.read_text())


def exists(path: Path) -> bool:
    return path.exists()


def by_trace(path: Path) -> dict[int, list[dict[str, Any]]]:
    grouped: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for entry in read(path):
        grouped[entry["id"]].append(entry)
    return dict(grouped)


async def test_settings_start_as_tritons_defaults(client: httpx.AsyncClient, trace_file: Path):
    for path in ("/v2/trace/setting", "/v2/models/simple/trace/setting"):
        answer = await client.get(path)
        assert answer.status_code == 200
        assert answer.headers["content-type"] == "application/json"
        assert answer.json() == defaults(trace_file)


async def test_server_metadata_lists_trace_and_logging(client: httpx.AsyncClient):
    extensions = (await client.get("/v2")).json()["extensions"]
    assert extensions[-2:] == ["trace", "logging"]


NOT_STRING = "attempt to access JSON non-string as string"
NO_FILE_CHANGE = "trace file location can not be updated through network protocol"
INVALID = "Attempting to set invalid trace setting :"
BAD_BODIES: list[tuple[Any, int, str | None]] = [
    ({"trace_level": "TIMESTAMPS"}, 500, "attempt to access JSON non-array as array"),
    ({"trace_level": [5]}, 500, NOT_STRING),
    ({"trace_level": ["TIMESTAMPS", 5]}, 500, NOT_STRING),
    ({"trace_level": ["OFF", "TIMESTAMPS"]}, 400, "Expect only one trace level 'OFF' is specified"),
    ({"trace_rate": 5}, 500, NOT_STRING),
    ({"trace_rate": True}, 500, NOT_STRING),
    ({"trace_rate": "abc"}, 400, "Unable to parse 'trace_rate', got: abc"),
    (
        {"trace_rate": "99999999999"},
        400,
        "Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ], got: 99999999999",
    ),
    ({"trace_count": 3}, 500, NOT_STRING),
    ({"trace_count": "-2"}, 400, "Unable to parse 'trace_count'. Expecting value >= -1, got:-2"),
    ({"log_frequency": "z"}, 400, "Unable to parse 'log_frequency', got: z"),
    ({"trace_file": "/tmp/x"}, 501, NO_FILE_CHANGE),
    ({"trace_file": None}, 501, NO_FILE_CHANGE),
    (
        {"trace_rate": "0", "trace_level": ["TIMESTAMPS"]},
        400,
        INVALID + "sample rate must be non-zero",
    ),
    ({"trace_count": "0", "trace_level": ["TIMESTAMPS"]}, 400, INVALID),
    (b"not json", 500, None),
    (b"", 500, "failed to parse the request JSON buffer: The document is empty. at 0"),
]


@pytest.mark.parametrize(("body", "status", "error"), BAD_BODIES)
async def test_bad_bodies_get_tritons_status_and_text(
    client: httpx.AsyncClient, trace_file: Path, body: Any, status: int, error: str | None
):
    for path in ("/v2/trace/setting", "/v2/models/simple/trace/setting"):
        answer = await post(client, path, body)
        assert answer.status_code == status, answer.text
        if error is None:
            assert answer.json()["error"].startswith("failed to parse the request JSON buffer: ")
        else:
            assert answer.json() == {"error": error}
        # Nothing was applied.
        assert (await client.get(path)).json() == defaults(trace_file)


async def test_lenient_values_are_read_as_triton_reads_them(client: httpx.AsyncClient):
    cases = [("-1", "4294967295"), ("1.5", "1"), (" 5", "5"), ("5x", "5"), ("+7", "7")]
    for given, shown in cases:
        answer = await post(client, "/v2/trace/setting", {"trace_rate": given})
        assert answer.json()["trace_rate"] == shown
    answer = await post(client, "/v2/trace/setting", {"log_frequency": "-1"})
    assert answer.json()["log_frequency"] == "4294967295"
    bodies: list[Any] = [{"trace_level": ["BOGUS"]}, {"trace_level": []}, {"bogus": "1"}, [1], 5]
    for body in bodies:
        assert (await post(client, "/v2/trace/setting", body)).status_code == 200
    assert (await client.get("/v2/trace/setting")).json()["trace_level"] == ["OFF"]


async def test_unknown_models_are_refused_before_the_body_is_read(client: httpx.AsyncClient):
    expected = {"error": "Request for unknown model : nosuch"}
    answer = await client.get("/v2/models/nosuch/trace/setting")
    assert (answer.status_code, answer.json()) == (400, expected)
    answer = await post(client, "/v2/models/nosuch/trace/setting", b"not json")
    assert (answer.status_code, answer.json()) == (400, expected)


async def test_model_settings_override_and_fall_back(client: httpx.AsyncClient):
    await post(client, "/v2/models/simple/trace/setting", {"trace_rate": "7"})
    await post(client, "/v2/trace/setting", {"trace_rate": "3", "trace_count": "10"})
    model = (await client.get("/v2/models/simple/trace/setting")).json()
    assert (model["trace_rate"], model["trace_count"]) == ("7", "10")
    assert (await client.get("/v2/models/other/trace/setting")).json()["trace_rate"] == "3"
    answer = await post(client, "/v2/models/simple/trace/setting", {"trace_rate": None})
    assert answer.json()["trace_rate"] == "3"
    everything = {
        "trace_level": None,
        "trace_rate": None,
        "trace_count": None,
        "log_frequency": None,
    }
    answer = await post(client, "/v2/trace/setting", everything)
    assert (answer.json()["trace_rate"], answer.json()["trace_count"]) == ("1000", "-1")


async def test_other_methods_get_405(client: httpx.AsyncClient):
    for path in ("/v2/trace/setting", "/v2/models/simple/trace/setting", "/v2/logging"):
        answer = await client.put(path)
        assert (answer.status_code, answer.json()) == (405, {"error": "Method Not Allowed"})


async def test_inferences_are_traced_to_the_file_in_order(
    repo: Path, tmp_path: Path, trace_file: Path
):
    before = time.monotonic_ns()
    async with traced_data_plane(repo, tmp_path / "cache", trace_file=str(trace_file)) as client:
        answer = await post(
            client, "/v2/trace/setting", {"trace_level": ["TIMESTAMPS"], "trace_rate": "1"}
        )
        assert answer.status_code == 200, answer.text
        await infer(client, request_id="first")
        await asyncio.gather(*(infer(client) for _ in range(6)))
        await infer(client, "other")
    after = time.monotonic_ns()
    traces = by_trace(trace_file)
    assert sorted(traces) == list(range(1, 9))
    for trace_id, entries in traces.items():
        head, *stamps = entries
        assert head["model_name"] == ("other" if trace_id == 8 else "simple")
        assert head["model_version"] == 1
        assert ("request_id" in head) == (trace_id == 1)
        assert [s["timestamps"][0]["name"] for s in stamps] == STAMPS
        times = [s["timestamps"][0]["ns"] for s in stamps]
        assert times == sorted(times)
        # Times come from CLOCK_MONOTONIC, the clock Triton's steady_clock reads.
        assert before <= times[0] and times[-1] <= after
    assert traces[1][0]["request_id"] == "first"


async def test_trace_count_bounds_the_traces(repo: Path, tmp_path: Path, trace_file: Path):
    async with traced_data_plane(repo, tmp_path / "cache", trace_file=str(trace_file)) as client:
        body = {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "3"}
        await post(client, "/v2/trace/setting", body)
        for _ in range(5):
            await infer(client)
        assert (await client.get("/v2/trace/setting")).json()["trace_count"] == "0"
        answer = await post(client, "/v2/trace/setting", {"trace_rate": "2"})
        assert (answer.status_code, answer.json()) == (
            400,
            {"error": "Attempting to set invalid trace setting :"},
        )
    # As in Triton: the count running out writes what it took to the next numbered file.
    assert sorted(by_trace(trace_file.with_name("trace.json.0"))) == [1, 2, 3]
    assert not exists(trace_file)


async def test_log_frequency_and_rate(repo: Path, tmp_path: Path, trace_file: Path):
    async with traced_data_plane(
        repo,
        tmp_path / "cache",
        trace_file=str(trace_file),
        trace_level=("TIMESTAMPS",),
        trace_rate=2,
        trace_log_frequency=2,
    ) as client:
        for _ in range(9):
            await infer(client)
    files = sorted(p.name for p in trace_file.parent.glob("trace.json*"))
    # Requests 2, 4, 6 and 8 traced, two to a file.
    assert files == ["trace.json.0", "trace.json.1"]
    assert [sorted(by_trace(trace_file.with_name(f))) for f in files] == [[1, 2], [3, 4]]


async def test_tensors_are_traced(repo: Path, tmp_path: Path, trace_file: Path):
    async with traced_data_plane(
        repo, tmp_path / "cache", trace_file=str(trace_file), trace_level=("TENSORS",), trace_rate=1
    ) as client:
        await infer(client, "other")
    assert read(trace_file) == [
        {
            "id": 1,
            "activity": "TENSOR_QUEUE_INPUT",
            "tensor": {"name": "INPUT0", "data": "1,2,3,4", "shape": "1,4", "dtype": "FP32"},
        },
        {
            "id": 1,
            "activity": "TENSOR_BACKEND_OUTPUT",
            "tensor": {"name": "OUTPUT0", "data": "1,2,3,4", "shape": "1,4", "dtype": "FP32"},
        },
    ]


async def test_logging_settings(client: httpx.AsyncClient):
    root = logging.getLogger()
    start = (await client.get("/v2/logging")).json()
    assert start == {
        "log_file": "",
        "log_info": root.isEnabledFor(logging.INFO),
        "log_warning": root.isEnabledFor(logging.WARNING),
        "log_error": True,
        "log_verbose_level": 1 if root.isEnabledFor(logging.DEBUG) else 0,
        "log_format": "default",
    }
    answer = await post(client, "/v2/logging", {"log_info": True, "log_verbose_level": 2})
    assert answer.json()["log_verbose_level"] == 2
    assert root.isEnabledFor(logging.DEBUG)
    answer = await post(client, "/v2/logging", {"log_verbose_level": 2**40})
    assert answer.json()["log_verbose_level"] == 0
    answer = await post(client, "/v2/logging", {"log_format": "ISO8601", "log_file": None})
    assert answer.json()["log_format"] == "ISO8601"


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        ({"log_file": "x"}, 501, "log file location can not be updated through network protocol"),
        ({"log_info": "false"}, 500, "attempt to access JSON non-boolean as boolean"),
        ({"log_error": 1}, 500, "attempt to access JSON non-boolean as boolean"),
        (
            {"log_verbose_level": -1},
            500,
            "attempt to access JSON non-unsigned-integer as unsigned-integer",
        ),
        (
            {"log_verbose_level": 1.5},
            500,
            "attempt to access JSON non-unsigned-integer as unsigned-integer",
        ),
        (
            {"log_verbose_level": 2**64},
            500,
            "attempt to access JSON non-unsigned-integer as unsigned-integer",
        ),
        ({"log_format": 5}, 500, "attempt to access JSON non-string as string"),
        ({"log_format": "iso8601"}, 503, "invalid argument for --log_format, got: iso8601"),
    ],
)
async def test_bad_logging_bodies(client: httpx.AsyncClient, body: Any, status: int, error: str):
    answer = await post(client, "/v2/logging", body)
    assert (answer.status_code, answer.json()) == (status, {"error": error})


async def test_logging_settings_before_a_bad_one_stay_applied(client: httpx.AsyncClient):
    answer = await post(client, "/v2/logging", {"log_warning": False, "log_format": "bad"})
    assert answer.status_code == 503
    assert (await client.get("/v2/logging")).json()["log_warning"] is False
    answer = await post(client, "/v2/logging", {"log_file": "x", "log_warning": True})
    assert answer.status_code == 501
    assert (await client.get("/v2/logging")).json()["log_warning"] is False
