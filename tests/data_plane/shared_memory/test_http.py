"""Shared memory through the data plane's HTTP API, in process (lifespan run, requests
through httpx's ASGI transport): the register, status and unregister routes, infer requests
reading inputs from regions and writing outputs to them, every refusal with its status and
text, and the server serving on after each."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from data_plane.settings import ModelControlMode
from tests.data_plane.server_app import data_plane
from tests.data_plane.shared_memory.cases import (
    CUDA_CASES,
    INFER_CASES,
    KEY,
    REGISTER_CASES,
    Case,
    params,
)
from tests.data_plane.shared_memory.objects import shm_entry, shm_object, unique_name
from tests.data_plane.shared_memory.requests import shm_input, shm_output
from tests.models import write_onnx_add_sub, write_onnx_identity

pytestmark = pytest.mark.anyio

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)
INFER = "/v2/models/simple/infer"


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # module scope: one server for the module


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    write_onnx_add_sub(root, "simple", dtype="INT32", dims=(16,), max_batch_size=8)
    write_onnx_identity(root, "strings", datatype="BYTES", dims=(-1,), max_batch_size=8)
    write_onnx_identity(root, "floats", datatype="FP32", dims=(-1,), max_batch_size=8)
    return root


@pytest.fixture(scope="module")
async def client(
    repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[httpx.AsyncClient]:
    async with data_plane(repo, tmp_path_factory.mktemp("cache"), mode=ModelControlMode.NONE) as c:
        yield c


@pytest.fixture(autouse=True)
async def no_regions_left(client: httpx.AsyncClient) -> AsyncIterator[None]:
    yield
    assert (await client.post("/v2/systemsharedmemory/unregister")).status_code == 200


@pytest.fixture
def regions() -> Any:
    """An input object holding A then B, and an output object of 128 bytes."""
    with shm_object(128) as (in_key, in_view), shm_object(128) as (out_key, out_view):
        in_view[:64] = A.tobytes()
        in_view[64:128] = B.tobytes()
        yield in_key, out_key, out_view


async def register(
    client: httpx.AsyncClient, name: str, key: str, byte_size: int, offset: int = 0
) -> None:
    answer = await client.post(
        f"/v2/systemsharedmemory/region/{name}/register",
        json={"key": key, "offset": offset, "byte_size": byte_size},
    )
    assert answer.status_code == 200, answer.text
    assert answer.content == b""


def inputs_in(region: str) -> list[dict[str, Any]]:
    return [shm_input("INPUT0", region, 0, 64), shm_input("INPUT1", region, 64, 64)]


async def assert_error(answer: httpx.Response, status: int, message: str) -> None:
    assert (answer.status_code, answer.json()) == (status, {"error": message})


async def assert_answer(answer: httpx.Response, case: Case) -> None:
    """The status ``case`` expects, with its error text, or no error at all."""
    assert answer.status_code == case.status, answer.text
    assert answer.headers["content-type"] == "application/json"
    if case.message is None:
        assert "error" not in (answer.json() if answer.content else {})
    else:
        assert answer.json() == {"error": case.message}


def written_by(body: dict[str, Any]) -> bytes:
    """What the ``simple`` model's shared-memory outputs in ``body`` leave in region ``out``."""
    expected = bytearray(128)
    values = {"OUTPUT0": (A + B).tobytes(), "OUTPUT1": (A - B).tobytes()}
    for output in body.get("outputs", []):
        place = output.get("parameters", {})
        if place.get("shared_memory_region") == "out":
            offset = place.get("shared_memory_offset", 0)
            expected[offset : offset + 64] = values[output["name"]]
    return bytes(expected)


def with_key(body: Any, key: str) -> Any:
    """A register case's body with its object's key in place of KEY."""
    if not isinstance(body, dict) or not isinstance(body.get("key"), str):
        return body
    return {**body, "key": body["key"].replace(KEY.lstrip("/"), key.lstrip("/"))}


async def assert_still_serving(client: httpx.AsyncClient) -> None:
    answer = await client.post(
        INFER,
        json={
            "inputs": [
                {"name": n, "datatype": "INT32", "shape": [1, 16], "data": A.ravel().tolist()}
                for n in ("INPUT0", "INPUT1")
            ]
        },
    )
    assert answer.status_code == 200
    assert answer.json()["outputs"][0]["data"] == (2 * A).ravel().tolist()


async def test_metadata_lists_system_shared_memory_only(client: httpx.AsyncClient) -> None:
    extensions = (await client.get("/v2")).json()["extensions"]
    assert "system_shared_memory" in extensions
    assert "cuda_shared_memory" not in extensions


async def test_register_status_unregister(client: httpx.AsyncClient) -> None:
    with shm_object(256) as (key, _):
        await register(client, "one", key, 128)
        await register(client, "two", key, 64, offset=128)
        status = await client.get("/v2/systemsharedmemory/status")
        assert status.headers["content-type"] == "application/json"
        assert status.json() == [
            {"name": "one", "key": key, "offset": 0, "byte_size": 128},
            {"name": "two", "key": key, "offset": 128, "byte_size": 64},
        ]
        one = await client.get("/v2/systemsharedmemory/region/two/status")
        assert one.json() == [{"name": "two", "key": key, "offset": 128, "byte_size": 64}]
        gone = await client.post("/v2/systemsharedmemory/region/one/unregister")
        assert (gone.status_code, gone.content) == (200, b"")
        assert [r["name"] for r in (await client.get("/v2/systemsharedmemory/status")).json()] == [
            "two"
        ]
        assert (await client.post("/v2/systemsharedmemory/unregister")).status_code == 200
        assert (await client.get("/v2/systemsharedmemory/status")).json() == []


async def test_infer_reads_inputs_and_writes_outputs(client: httpx.AsyncClient, regions) -> None:
    in_key, out_key, out_view = regions
    await register(client, "in", in_key, 128)
    await register(client, "out", out_key, 128)
    answer = await client.post(
        INFER,
        json={
            "id": "shm-1",
            "inputs": inputs_in("in"),
            "outputs": [shm_output("OUTPUT0", "out", 0, 64), shm_output("OUTPUT1", "out", 64, 64)],
        },
    )
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/json"
    # Triton's answer: each output's name, datatype and shape, no data and no parameters.
    assert answer.json() == {
        "id": "shm-1",
        "model_name": "simple",
        "model_version": "1",
        "outputs": [
            {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16]},
            {"name": "OUTPUT1", "datatype": "INT32", "shape": [1, 16]},
        ],
    }
    assert np.frombuffer(bytes(out_view[:64]), dtype="<i4").tolist() == (A + B).ravel().tolist()
    assert np.frombuffer(bytes(out_view[64:128]), dtype="<i4").tolist() == (A - B).ravel().tolist()


async def test_outputs_in_shared_memory_and_in_the_body(client: httpx.AsyncClient, regions) -> None:
    in_key, out_key, out_view = regions
    await register(client, "in", in_key, 128)
    await register(client, "out", out_key, 128)
    answer = await client.post(
        INFER,
        json={
            "inputs": inputs_in("in"),
            "outputs": [shm_output("OUTPUT0", "out", 0, 128), {"name": "OUTPUT1"}],
        },
    )
    assert answer.status_code == 200
    first, second = answer.json()["outputs"]
    assert first == {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16]}
    assert second["data"] == (A - B).ravel().tolist()
    assert np.frombuffer(bytes(out_view[:64]), dtype="<i4").tolist() == (A + B).ravel().tolist()
    # No output named: every output comes back in the body, inputs still from the region.
    every = await client.post(INFER, json={"inputs": inputs_in("in")})
    assert [o["data"] for o in every.json()["outputs"]] == [
        (A + B).ravel().tolist(),
        (A - B).ravel().tolist(),
    ]


async def test_one_input_from_memory_one_in_the_body(client: httpx.AsyncClient, regions) -> None:
    in_key, _, _ = regions
    await register(client, "in", in_key, 128)
    answer = await client.post(
        INFER,
        json={
            "inputs": [
                shm_input("INPUT0", "in", None, 64),  # the offset defaults to 0
                {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16},
            ]
        },
    )
    assert answer.status_code == 200
    assert answer.json()["outputs"][0]["data"] == (A + 1).ravel().tolist()


async def test_bytes_tensors(client: httpx.AsyncClient) -> None:
    elements = [b"", b"shared", "memory \u2713".encode()]
    framed = b"".join(len(e).to_bytes(4, "little") + e for e in elements)
    with shm_object(len(framed)) as (in_key, in_view), shm_object(256) as (out_key, out_view):
        in_view[: len(framed)] = framed
        await register(client, "s-in", in_key, len(framed))
        await register(client, "s-out", out_key, 256)
        answer = await client.post(
            "/v2/models/strings/infer",
            json={
                "inputs": [
                    shm_input("INPUT0", "s-in", 0, len(framed), shape=[1, 3], datatype="BYTES")
                ],
                "outputs": [shm_output("OUTPUT0", "s-out", 0, 256)],
            },
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"] == [
            {"name": "OUTPUT0", "datatype": "BYTES", "shape": [1, 3]}
        ]
        assert bytes(out_view[: len(framed)]) == framed


async def test_large_tensors(client: httpx.AsyncClient) -> None:
    # Past the size copied on the event loop: both copies run in a worker thread.
    values = np.linspace(-1, 1, 600_000, dtype=np.float32).reshape(1, -1)
    size = values.nbytes
    with shm_object(size) as (in_key, in_view), shm_object(size) as (out_key, out_view):
        in_view[:size] = values.tobytes()
        await register(client, "big-in", in_key, size)
        await register(client, "big-out", out_key, size)
        answer = await client.post(
            "/v2/models/floats/infer",
            json={
                "inputs": [
                    shm_input("INPUT0", "big-in", 0, size, shape=values.shape, datatype="FP32")
                ],
                "outputs": [shm_output("OUTPUT0", "big-out", 0, size)],
            },
        )
        assert answer.status_code == 200, answer.text
        assert np.array_equal(np.frombuffer(bytes(out_view[:size]), dtype="<f4"), values.ravel())


@pytest.mark.parametrize("case", params(REGISTER_CASES))
async def test_register(client: httpx.AsyncClient, case: Case) -> None:
    with shm_object(128) as (key, _):
        answer = await client.post(
            "/v2/systemsharedmemory/region/r/register", json=with_key(case.body, key)
        )
        await assert_answer(answer, case)
        expected = [] if case.status != 200 else [("r", case.body.get("offset", 0))]
        regions = (await client.get("/v2/systemsharedmemory/status")).json()
        assert [(r["name"], r["offset"]) for r in regions] == expected
    await assert_still_serving(client)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"not json", "failed to parse the request JSON buffer: "),
        (b"", "failed to parse the request JSON buffer: "),
        (b'{"key": "/x", "byte_size": 8} trailing', "failed to parse the request JSON buffer: "),
    ],
)
async def test_register_body_not_json(client: httpx.AsyncClient, body: bytes, message: str) -> None:
    answer = await client.post("/v2/systemsharedmemory/region/r/register", content=body)
    assert answer.status_code == 500
    assert answer.json()["error"].startswith(message)


async def test_register_refuses_a_fifo(client: httpx.AsyncClient) -> None:
    with shm_entry("fifo") as key:
        answer = await client.post(
            "/v2/systemsharedmemory/region/r/register", json={"key": key, "byte_size": 1}
        )
        await assert_error(answer, 400, "failed to register shared memory region 'r': invalid args")
    await assert_still_serving(client)


@pytest.mark.parametrize("kind", ["link", "dir"])
async def test_register_refuses_what_is_not_a_plain_object(
    client: httpx.AsyncClient, kind: str
) -> None:
    with shm_entry(kind) as key:
        answer = await client.post(
            "/v2/systemsharedmemory/region/r/register", json={"key": key, "byte_size": 1}
        )
        await assert_error(answer, 500, f"Unable to open shared memory region: '{key}'")
    await assert_still_serving(client)


async def test_register_twice_and_empty_window(client: httpx.AsyncClient) -> None:
    with shm_object(64) as (key, _):
        await register(client, "r", key, 64)
        again = await client.post(
            "/v2/systemsharedmemory/region/r/register", json={"key": key, "byte_size": 64}
        )
        await assert_error(again, 400, "shared memory region 'r' already in manager")
        empty = await client.post(
            "/v2/systemsharedmemory/region/z/register", json={"key": key, "byte_size": 0}
        )
        assert empty.status_code == 400
        assert empty.json()["error"].startswith("failed to register shared memory region 'z': ")
    await assert_still_serving(client)


async def test_status_and_unregister_of_unknown_regions(client: httpx.AsyncClient) -> None:
    missing = await client.get("/v2/systemsharedmemory/region/nope/status")
    await assert_error(missing, 404, "Unable to find system shared memory region: 'nope'")
    answer = await client.post("/v2/systemsharedmemory/region/nope/unregister")
    assert (answer.status_code, answer.content) == (200, b"")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v2/systemsharedmemory/region/r/register"),
        ("POST", "/v2/systemsharedmemory/status"),
        ("GET", "/v2/systemsharedmemory/unregister"),
        ("PUT", "/v2/systemsharedmemory/region/r/unregister"),
        ("GET", "/v2/cudasharedmemory/region/r/register"),
    ],
)
async def test_other_methods(client: httpx.AsyncClient, method: str, path: str) -> None:
    await assert_error(await client.request(method, path), 405, "Method Not Allowed")


@pytest.mark.parametrize("case", params(INFER_CASES))
async def test_infer(client: httpx.AsyncClient, regions, case: Case) -> None:
    in_key, out_key, out_view = regions
    with shm_object(32) as (small_key, _):
        await register(client, "in", in_key, 128)
        await register(client, "out", out_key, 128)
        await register(client, "small", small_key, 32)
        await assert_answer(await client.post(INFER, json=case.body), case)
    assert bytes(out_view[:128]) == written_by(case.body if case.status == 200 else {})
    await assert_still_serving(client)


async def test_an_unregistered_region_is_unknown_to_infer(
    client: httpx.AsyncClient, regions
) -> None:
    in_key, _, _ = regions
    await register(client, "in", in_key, 128)
    assert (await client.post(INFER, json={"inputs": inputs_in("in")})).status_code == 200
    await client.post("/v2/systemsharedmemory/region/in/unregister")
    answer = await client.post(INFER, json={"inputs": inputs_in("in")})
    await assert_error(answer, 404, "Unable to find shared memory region: 'in'")


async def test_a_region_outside_its_window_is_not_read(client: httpx.AsyncClient) -> None:
    # Registered from byte 4096, 64 bytes: a place past those 64 is refused even though the
    # object goes on (Triton 2.51 reads on there).
    with shm_object(8192) as (key, _):
        await register(client, "w", key, 64, offset=4096)
        answer = await client.post(
            INFER,
            json={"inputs": [shm_input("INPUT0", "w", 0, 64), shm_input("INPUT1", "w", 32, 64)]},
        )
        await assert_error(answer, 400, "Invalid offset + byte size for shared memory region: 'w'")


@pytest.mark.parametrize("case", params(CUDA_CASES))
async def test_cuda_shared_memory_without_cuda(client: httpx.AsyncClient, case: Case) -> None:
    method, path, body = case.body
    answer = await client.request(method, path, json=body)
    await assert_answer(answer, case)
    if path.endswith("/cudasharedmemory/status"):
        assert answer.json() == []


async def test_regions_are_closed_when_the_server_stops(repo: Path, tmp_path: Path) -> None:
    with shm_object(64) as (key, _):
        path = f"/dev/shm{key}"
        before = _open_descriptors_of(path)  # the client's own
        async with data_plane(repo, tmp_path / "cache", mode=ModelControlMode.EXPLICIT) as c:
            await register(c, "r", key, 64)
            assert _open_descriptors_of(path) == before + 1
        assert _open_descriptors_of(path) == before


def _open_descriptors_of(path: str) -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == path
        except OSError:
            continue
    return count


async def test_region_names_need_no_quoting(client: httpx.AsyncClient) -> None:
    name = unique_name("with space")
    with shm_object(16) as (key, _):
        answer = await client.post(
            f"/v2/systemsharedmemory/region/{name}/register", json={"key": key, "byte_size": 16}
        )
        assert answer.status_code == 200
        assert (await client.get("/v2/systemsharedmemory/status")).json()[0]["name"] == name
