"""Sequence models against real Triton 2.51: the same repository of Triton-form Python
accumulators (``TRITON_ACCUMULATOR``: it answers its running sum and what it saw of each
request: control tensors, state input, correlation ID, flags) served by Triton and by
``zeroserve serve``; the same requests to both, over HTTP and gRPC, get the same answers,
status codes and texts. Skips, saying why, where Triton cannot run.

Where zeroserve answers otherwise, on purpose, and so is not compared: a TYPE_STRING CORRID
(Triton 2.51 writes a malformed string tensor there, which its Python backend refuses), a
sequence_id past the uint64 range over HTTP (Triton answers 500 "Unable to parse", zeroserve
400 with the same text), a state without an input name (Triton crashes), and the text of a
config refused before any version is built (Triton leaves the reason to its log, zeroserve
appends it to the same words).
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from foundation.proto import grpc_service_pb2 as pb
from tests.data_plane.sequence.models import STATE, write_python_accumulator
from tests.integration.conftest import ServerProcess, free_port, start_server
from tests.triton_oracle import TritonServer, require_triton, run_triton, triton_refusal

pytestmark = pytest.mark.integration

TIMEOUT_S = 60.0
IDLE_US = 2_000_000
"""acc_idle's idle time: long enough that a loaded machine's delay between two steps stays
within it, short enough to wait out."""
BUSY_MACHINE_IDLE_US = 10_000_000
"""The other accumulators' idle time (Triton's default, 1 s, is shorter than a loaded
machine's worst pause between two steps)."""
LOADED = ("acc_direct", "acc_oldest", "acc_single", "acc_one", "acc_idle", "acc_state")
BAD_STATE = """
state [ { input_name: "ACC" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [ 1 ]
          initial_state [ { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "a" },
                          { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "b" } ] } ]
"""


@dataclass(frozen=True)
class Servers:
    triton: TritonServer
    zeroserve: ServerProcess
    zeroserve_grpc: str
    repository: Path

    def http_urls(self) -> tuple[str, str]:
        return self.triton.http_url, self.zeroserve.url

    def grpc_addresses(self) -> tuple[str, str]:
        return self.triton.grpc_address, self.zeroserve_grpc


def write_repository(repo: Path) -> None:
    # Triton's default idle time (1 s) ends a sequence whose next step a loaded 2-core
    # machine delays past it, on either server; only acc_idle is about idle release.
    write_python_accumulator(repo, "acc_direct", idle_us=BUSY_MACHINE_IDLE_US)
    write_python_accumulator(
        repo,
        "acc_oldest",
        strategy="oldest { max_candidate_sequences: 2 }",
        max_batch_size=4,
        idle_us=BUSY_MACHINE_IDLE_US,
    )
    write_python_accumulator(repo, "acc_single", max_batch_size=0, idle_us=BUSY_MACHINE_IDLE_US)
    write_python_accumulator(repo, "acc_one", max_batch_size=1, idle_us=BUSY_MACHINE_IDLE_US)
    write_python_accumulator(repo, "acc_idle", max_batch_size=1, idle_us=IDLE_US)
    write_python_accumulator(repo, "acc_state", extra=STATE, idle_us=BUSY_MACHINE_IDLE_US)
    write_python_accumulator(repo, "bad_state", extra=BAD_STATE)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    install = require_triton()
    repo = tmp_path_factory.mktemp("repo")
    write_repository(repo)
    loads = ["--model-control-mode=explicit", *(f"--load-model={m}" for m in LOADED)]
    with run_triton(install, repo, tmp_path_factory.mktemp("triton-log"), *loads) as triton:
        grpc_port = free_port()
        zeroserve = start_server(
            repo, tmp_path_factory.mktemp("zeroserve-log"), "--grpc-port", str(grpc_port), *loads
        )
        try:
            with httpx.Client(base_url=zeroserve.url, timeout=TIMEOUT_S) as client:
                for model in LOADED:
                    assert client.get(f"/v2/models/{model}/ready").status_code == 200
            yield Servers(triton, zeroserve, f"127.0.0.1:{grpc_port}", repo)
        finally:
            zeroserve.stop()


def body(value: int, *, rows: int = 1, batching: bool = True, **parameters: Any) -> dict[str, Any]:
    shape = [rows, 1] if batching else [rows]
    return {
        "inputs": [{"name": "INPUT", "datatype": "INT32", "shape": shape, "data": [value] * rows}],
        "parameters": parameters,
    }


def infer(base: str, model: str, payload: dict[str, Any]) -> tuple[int, Any]:
    response = httpx.post(f"{base}/v2/models/{model}/infer", json=payload, timeout=TIMEOUT_S)
    answer = response.json()
    if response.status_code == 200:
        answer = {o["name"]: o for o in answer["outputs"]}
        answer["INFO"]["data"] = [json.loads(text) for text in answer["INFO"]["data"]]
    return response.status_code, answer


Step = tuple[str, dict[str, Any]]


def both(servers: Servers, steps: list[Step]) -> None:
    """Send ``steps`` to each server in turn; the answers must be the same, step by step."""
    answers = [
        [infer(base, model, payload) for model, payload in steps] for base in servers.http_urls()
    ]
    assert answers[1] == answers[0]


def sequence(model: str, cid: int | str, values: list[int], **options: Any) -> list[Step]:
    steps = []
    for index, value in enumerate(values):
        flags: dict[str, Any] = {"sequence_id": cid}
        if index == 0:
            flags["sequence_start"] = True
        if index == len(values) - 1:
            flags["sequence_end"] = True
        steps.append((model, body(value, **options, **flags)))
    return steps


@pytest.mark.parametrize("model", ["acc_direct", "acc_oldest", "acc_state"])
@pytest.mark.parametrize("cid", [7, "seven"])
def test_a_sequence_start_to_end(servers: Servers, model: str, cid: int | str) -> None:
    both(servers, sequence(model, cid, [1, 2, 3, 4]))


def test_a_model_without_batching(servers: Servers) -> None:
    both(servers, sequence("acc_single", 12, [5, 6], batching=False))


@pytest.mark.parametrize(
    "steps",
    [
        pytest.param([("acc_direct", body(1))], id="no-correlation-id"),
        pytest.param([("acc_direct", body(1, sequence_id=0, sequence_start=True))], id="id-0"),
        pytest.param([("acc_direct", body(1, sequence_id="", sequence_start=True))], id="id-empty"),
        pytest.param([("acc_direct", body(1, sequence_id=404))], id="no-start"),
        pytest.param(
            [("acc_direct", body(1, sequence_id="x404", sequence_end=True))], id="no-start-end"
        ),
        pytest.param(
            [("acc_direct", body(1, rows=2, sequence_id=5, sequence_start=True))], id="two-rows"
        ),
        pytest.param(
            [
                *sequence("acc_direct", 6, [1, 1]),
                ("acc_direct", body(1, sequence_id=6, sequence_end=True)),
            ],
            id="end-twice",
        ),
        pytest.param(
            [
                ("acc_direct", body(4, sequence_id=8, sequence_start=True)),
                ("acc_direct", body(4, sequence_id=8, sequence_start=True)),
                ("acc_direct", body(4, sequence_id=8, sequence_end=True)),
            ],
            id="start-again-restarts",
        ),
        pytest.param(
            [("acc_direct", body(1, sequence_id=9, sequence_start=True, sequence_end=True))],
            id="start-and-end-in-one",
        ),
    ],
)
def test_the_same_answer_to_each_step(servers: Servers, steps: list[Step]) -> None:
    both(servers, steps)


@pytest.mark.parametrize("cid", [-1, 2**64, 1.5])
def test_an_unparseable_sequence_id_is_a_client_error_with_tritons_text(
    servers: Servers, cid: object
) -> None:
    triton, zeroserve = (
        infer(base, "acc_direct", body(1, sequence_id=cid, sequence_start=True))
        for base in servers.http_urls()
    )
    assert triton[0] == 500  # Triton's status for it; zeroserve keeps a 4xx
    assert zeroserve == (400, triton[1])


def concurrently(base: str, model: str, ids: list[int | str], steps: int) -> dict[str, Any]:
    answers: dict[str, Any] = {}

    def run(cid: int | str) -> None:
        for index, (name, payload) in enumerate(sequence(model, cid, [1] * steps)):
            answers[f"{cid}/{index}"] = infer(base, name, payload)

    threads = [threading.Thread(target=run, args=(cid,)) for cid in ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT_S)
    return answers


@pytest.mark.parametrize("model", ["acc_direct", "acc_oldest"])
def test_interleaved_sequences_past_the_slots(servers: Servers, model: str) -> None:
    ids: list[int | str] = [21, 22, "c23", 24, 25]
    answers = [concurrently(base, model, ids, 4) for base in servers.http_urls()]
    assert len(answers[0]) == len(ids) * 4
    assert answers[1] == answers[0]


def backlog_timeout(base: str) -> list[tuple[int, Any]]:
    """One slot: 31 holds it; 32 waits with a 200 ms timeout and fails; 31 goes on."""
    answers = [infer(base, "acc_one", body(1, sequence_id=31, sequence_start=True))]
    answers.append(
        infer(base, "acc_one", body(2, sequence_id=32, sequence_start=True, timeout=200_000))
    )
    answers.append(infer(base, "acc_one", body(3, sequence_id=31, sequence_end=True)))
    answers.append(infer(base, "acc_one", body(2, sequence_id=32)))
    return answers


def test_a_backlogged_sequence_times_out(servers: Servers) -> None:
    answers = [backlog_timeout(base) for base in servers.http_urls()]
    expired = {"error": "timeout of the corresponding sequence has been expired"}
    assert answers[0][1] == (503, expired)
    assert answers[1] == answers[0]


def idle_release(base: str) -> list[tuple[int, Any]]:
    answers = [infer(base, "acc_idle", body(1, sequence_id=41, sequence_start=True))]
    time.sleep(3 * IDLE_US / 1e6)  # the sequence goes idle: both reapers end it
    answers.append(infer(base, "acc_idle", body(1, sequence_id=41)))
    answers.append(infer(base, "acc_idle", body(1, sequence_id=41, sequence_start=True)))
    answers.append(infer(base, "acc_idle", body(1, sequence_id=41, sequence_end=True)))
    return answers


def test_an_idle_sequence_is_released(servers: Servers) -> None:
    answers = [idle_release(base) for base in servers.http_urls()]
    assert answers[0][1][0] == 400
    assert answers[1] == answers[0]


def test_a_state_refused_at_load_with_tritons_text(
    servers: Servers, tmp_path_factory: pytest.TempPathFactory
) -> None:
    refused = httpx.post(
        f"{servers.zeroserve.url}/v2/repository/models/bad_state/load", timeout=TIMEOUT_S
    )
    # Asked of a Triton of its own: Triton 2.51 can hang on a Python model it refuses.
    repo = servers.repository
    expected = triton_refusal(repo, tmp_path_factory.mktemp("triton-refusal-log"), "bad_state")
    assert expected.status_code == 400
    assert (refused.status_code, refused.json()) == (expected.status_code, expected.json())


def test_config_is_the_same(servers: Servers) -> None:
    for model in ("acc_direct", "acc_oldest", "acc_state"):
        configs = [
            httpx.get(f"{base}/v2/models/{model}/config", timeout=TIMEOUT_S).json()
            for base in servers.http_urls()
        ]
        assert configs[1]["sequence_batching"] == configs[0]["sequence_batching"]


def grpc_infer(address: str, request: pb.ModelInferRequest) -> tuple[str, Any]:
    with grpc.insecure_channel(address) as channel:
        call: Callable[..., Any] = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        try:
            response = call(request, timeout=TIMEOUT_S)
        except grpc.RpcError as error:
            return error.code().name, error.details()
    names = [o.name for o in response.outputs]
    info = response.raw_output_contents[names.index("INFO")]
    total = np.frombuffer(response.raw_output_contents[names.index("OUTPUT")], dtype=np.int32)
    return "OK", (total.tolist(), json.loads(info[4:]))


def grpc_request(value: int, **parameters: tuple[str, Any]) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="acc_direct")
    request.inputs.add(name="INPUT", datatype="INT32", shape=[1, 1])
    request.raw_input_contents.append(np.array([[value]], dtype=np.int32).tobytes())
    for key, (choice, parameter) in parameters.items():
        setattr(request.parameters[key], choice, parameter)
    return request


NEGATIVE = ("int64_param", -5)


@pytest.mark.parametrize(
    "requests",
    [
        pytest.param(
            [
                grpc_request(3, sequence_id=NEGATIVE, sequence_start=("bool_param", True)),
                grpc_request(3, sequence_id=NEGATIVE, sequence_end=("bool_param", True)),
            ],
            id="negative-int64-id",
        ),
        pytest.param(
            [grpc_request(3, sequence_id=("uint64_param", 5), sequence_start=("bool_param", True))],
            id="uint64-param-refused",
        ),
        pytest.param(
            [grpc_request(3, sequence_id=("string_param", "g"), sequence_start=("int64_param", 1))],
            id="start-not-bool",
        ),
        pytest.param([grpc_request(3, sequence_id=("string_param", "nope"))], id="no-start"),
        pytest.param([grpc_request(3)], id="no-id"),
    ],
)
def test_grpc_answers(servers: Servers, requests: list[pb.ModelInferRequest]) -> None:
    answers = [
        [grpc_infer(address, request) for request in requests]
        for address in servers.grpc_addresses()
    ]
    assert answers[1] == answers[0]


def stream(address: str, ids: list[int | str], steps: int) -> dict[str, Any]:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(address)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    results: dict[str, Any] = {}
    try:
        for step in range(steps):
            for cid in ids:
                tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
                tensor.set_data_from_numpy(np.array([[step]], dtype=np.int32))
                client.async_stream_infer(
                    "acc_oldest",
                    [tensor],
                    request_id=f"{cid}/{step}",
                    sequence_id=cid,
                    sequence_start=step == 0,
                    sequence_end=step == steps - 1,
                )
        for _ in range(steps * len(ids)):
            result, error = answers.get(timeout=TIMEOUT_S)
            if error is not None:
                results[f"error {len(results)}"] = str(error)
                continue
            info = json.loads(result.as_numpy("INFO").reshape(-1)[0])
            results[result.get_response().id] = (result.as_numpy("OUTPUT").tolist(), info)
    finally:
        client.stop_stream()
        client.close()
    return results


def test_sequences_pipelined_on_a_stream(servers: Servers) -> None:
    ids: list[int | str] = [51, "s52", 53]
    answers = [stream(address, ids, 5) for address in servers.grpc_addresses()]
    assert len(answers[0]) == 15
    assert answers[1] == answers[0]
