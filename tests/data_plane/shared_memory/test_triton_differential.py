"""The same shared-memory requests to real Triton 2.51 and to zeroserve: the same status codes
and error texts (where zeroserve differs on purpose, each case says so and gives Triton's
answer), the same infer responses and the same bytes written to output regions.

Triton runs from the ``nvidia-pytriton`` wheel (tests/triton_oracle.py) with its Python
backend serving ``simple`` (INT32 add and subtract) as a Triton-form ``model.py``; zeroserve
serves the same computation as ONNX, in process. Skips visibly where Triton cannot run.
"""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from data_plane.settings import ModelControlMode
from tests.data_plane.server_app import data_plane
from tests.data_plane.shared_memory.cases import (
    CUDA_CASES,
    INFER_CASES,
    REGISTER_CASES,
    Case,
    params,
)
from tests.data_plane.shared_memory.objects import shm_entry, shm_object
from tests.data_plane.shared_memory.requests import shm_input, shm_output
from tests.data_plane.shared_memory.test_http import A, B, with_key, written_by
from tests.models import write_onnx_add_sub
from tests.triton_oracle import TritonServer, triton_for

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

TRITON_SIMPLE = """\
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
                outputs = [pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]
                responses.append(pb_utils.InferenceResponse(outputs))
            return responses
"""
TRITON_CONFIG = """\
name: "simple"
backend: "python"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
"""


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    repo = tmp_path_factory.mktemp("triton-repo")
    (repo / "simple" / "1").mkdir(parents=True)
    (repo / "simple" / "config.pbtxt").write_text(TRITON_CONFIG)
    (repo / "simple" / "1" / "model.py").write_text(textwrap.dedent(TRITON_SIMPLE))
    with triton_for(repo, tmp_path_factory.mktemp("triton-logs")) as server:
        yield server


@pytest.fixture(scope="module")
async def servers(
    triton: TritonServer, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[dict[str, httpx.AsyncClient]]:
    repo = tmp_path_factory.mktemp("repo")
    write_onnx_add_sub(repo, "simple", dtype="INT32", dims=(16,), max_batch_size=8)
    cache = tmp_path_factory.mktemp("cache")
    async with (
        data_plane(repo, cache, mode=ModelControlMode.NONE) as zeroserve,
        httpx.AsyncClient(base_url=triton.http_url, timeout=60.0) as real,
    ):
        yield {"triton": real, "zeroserve": zeroserve}


@pytest.fixture(autouse=True)
async def no_regions_left(servers: dict[str, httpx.AsyncClient]) -> AsyncIterator[None]:
    yield
    for client in servers.values():
        assert (await client.post("/v2/systemsharedmemory/unregister")).status_code == 200


def answer_of(response: httpx.Response) -> tuple[int, str | None]:
    """The status and the error text, None when the answer is no error."""
    body = response.json() if response.content else None
    return response.status_code, body.get("error") if isinstance(body, dict) else None


def assert_answers(case: Case, answers: dict[str, tuple[int, str | None]]) -> None:
    assert answers["zeroserve"] == (case.status, case.message)
    assert answers["triton"] == (case.triton or (case.status, case.message))


@pytest.mark.parametrize("case", params(REGISTER_CASES))
async def test_register(servers: dict[str, httpx.AsyncClient], case: Case) -> None:
    answers = {}
    for name, client in servers.items():
        with shm_object(128) as (key, _):
            response = await client.post(
                "/v2/systemsharedmemory/region/r/register", json=with_key(case.body, key)
            )
            answers[name] = answer_of(response)
    assert_answers(case, answers)


@pytest.mark.parametrize("kind", ["link", "dir", "fifo"])
async def test_register_what_is_not_a_plain_object(
    servers: dict[str, httpx.AsyncClient], kind: str
) -> None:
    with shm_entry(kind) as key:
        expected = (
            (400, "failed to register shared memory region 'r': invalid args")
            if kind == "fifo"
            else (500, f"Unable to open shared memory region: '{key}'")
        )
        for client in servers.values():
            response = await client.post(
                "/v2/systemsharedmemory/region/r/register", json={"key": key, "byte_size": 1}
            )
            assert answer_of(response) == expected


async def test_register_twice_status_and_unregister(servers: dict[str, httpx.AsyncClient]) -> None:
    with shm_object(64) as (key_a, _), shm_object(64) as (key_b, _):
        bodies: dict[str, list[Any]] = {}
        steps = [
            ("POST", "region/b/register", {"key": key_b, "byte_size": 64}),
            ("POST", "region/a/register", {"key": key_a, "byte_size": 32}),
            ("POST", "region/a/register", {"key": key_a, "byte_size": 32}),
            ("GET", "status", None),
            ("GET", "region/a/status", None),
            ("GET", "region/zz/status", None),
            ("POST", "region/zz/unregister", None),
            ("POST", "region/a/unregister", None),
            ("GET", "status", None),
            ("POST", "unregister", None),
            ("GET", "status", None),
            ("GET", "region/a/register", None),
            ("POST", "status", None),
        ]
        for name, client in servers.items():
            bodies[name] = []
            for method, path, body in steps:
                response = await client.request(method, f"/v2/systemsharedmemory/{path}", json=body)
                bodies[name].append(
                    (response.status_code, response.json() if response.content else None)
                )
        assert bodies["zeroserve"] == bodies["triton"]
        assert bodies["triton"][2] == (
            400,
            {"error": "shared memory region 'a' already in manager"},
        )
        assert bodies["triton"][3][1] == [
            {"name": "a", "key": key_a, "offset": 0, "byte_size": 32},
            {"name": "b", "key": key_b, "offset": 0, "byte_size": 64},
        ]


@pytest.mark.parametrize("case", params(INFER_CASES))
async def test_infer(servers: dict[str, httpx.AsyncClient], case: Case) -> None:
    answers = {}
    bodies = {}
    written = {}
    for name, client in servers.items():
        with (
            shm_object(128) as (in_key, in_view),
            shm_object(128) as (out_key, out_view),
            shm_object(32) as (small_key, _),
        ):
            in_view[:128] = A.tobytes() + B.tobytes()
            for region, key, size in (
                ("in", in_key, 128),
                ("out", out_key, 128),
                ("small", small_key, 32),
            ):
                registered = await client.post(
                    f"/v2/systemsharedmemory/region/{region}/register",
                    json={"key": key, "byte_size": size},
                )
                assert registered.status_code == 200, registered.text
            response = await client.post("/v2/models/simple/infer", json=case.body)
            answers[name] = answer_of(response)
            bodies[name] = response.json()
            written[name] = bytes(out_view[:128])
    assert_answers(case, answers)
    if case.status == 200:
        assert bodies["zeroserve"] == bodies["triton"]
        assert written["zeroserve"] == written["triton"] == written_by(case.body)


async def test_infer_response_with_outputs_in_memory_and_in_the_body(
    servers: dict[str, httpx.AsyncClient],
) -> None:
    bodies = {}
    for name, client in servers.items():
        with shm_object(128) as (in_key, in_view), shm_object(64) as (out_key, _):
            in_view[:128] = A.tobytes() + B.tobytes()
            for region, key, size in (("in", in_key, 128), ("out", out_key, 64)):
                await client.post(
                    f"/v2/systemsharedmemory/region/{region}/register",
                    json={"key": key, "byte_size": size},
                )
            response = await client.post(
                "/v2/models/simple/infer",
                json={
                    "id": "mixed",
                    "inputs": [
                        shm_input("INPUT0", "in", 0, 64),
                        shm_input("INPUT1", "in", None, 64),
                    ],
                    "outputs": [shm_output("OUTPUT0", "out", 0, 64), {"name": "OUTPUT1"}],
                },
            )
            bodies[name] = (response.status_code, response.json())
    assert bodies["zeroserve"] == bodies["triton"]
    # INPUT1 at the default offset 0 reads A again: OUTPUT1 is A - A.
    assert bodies["triton"][1]["outputs"][1]["data"] == np.zeros(16, dtype=int).tolist()


@pytest.mark.parametrize("case", params(CUDA_CASES))
async def test_cuda(servers: dict[str, httpx.AsyncClient], case: Case) -> None:
    method, path, body = case.body
    answers = {}
    for name, client in servers.items():
        answers[name] = answer_of(await client.request(method, path, json=body))
    assert_answers(case, answers)


async def test_server_metadata_lists_what_each_supports(
    servers: dict[str, httpx.AsyncClient],
) -> None:
    triton = (await servers["triton"].get("/v2")).json()["extensions"]
    zeroserve = (await servers["zeroserve"].get("/v2")).json()["extensions"]
    assert "system_shared_memory" in triton and "system_shared_memory" in zeroserve
    # Triton lists CUDA shared memory even where it cannot register a region; we do not.
    assert "cuda_shared_memory" in triton and "cuda_shared_memory" not in zeroserve
