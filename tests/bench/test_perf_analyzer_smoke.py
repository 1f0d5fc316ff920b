"""Triton's perf_analyzer 2.51 against a ``zeroserve serve`` data plane: short runs over HTTP
and gRPC (sync, ``--async``, ``--shared-memory system``) and ``--streaming`` on a decoupled
model, each failing the test when perf_analyzer reports an error. No timing is asserted:
the numbers say that the tool runs, not how fast anything is. Skips, saying why, where
perf_analyzer cannot run here (``bench.perf_analyzer.perf_analyzer_install``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from bench.perf_analyzer import PerfAnalyzerInstall, perf_analyzer_install, run_point
from foundation.proto import model_config_pb2 as mc
from tests.integration.conftest import ServerProcess, free_port, start_server
from tests.models import write_config
from tests.triton_oracle import write_python_backend_model

pytestmark = pytest.mark.integration

REQUESTS = 40
"""Requests of each run: enough for perf_analyzer's report, a second or two."""
TIMEOUT_S = 120.0

IDENTITY = """\
class TritonPythonModel:
    def execute(self, inputs):
        return {"OUTPUT0": inputs["INPUT0"]}
"""
"""zeroserve's in-process dict contract: the cheapest model to measure."""

REPEAT = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            sender = request.get_response_sender()
            for step in range(3):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x + step)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
"""A decoupled model in Triton's contract: three responses and a bare final flag."""


def _config(name: str, *, decoupled: bool = False) -> mc.ModelConfig:
    config = mc.ModelConfig(name=name, backend="python", max_batch_size=0)
    config.input.add(name="INPUT0", data_type=mc.TYPE_FP32, dims=[4])
    config.output.add(name="OUTPUT0", data_type=mc.TYPE_FP32, dims=[4])
    config.model_transaction_policy.decoupled = decoupled
    return config


@dataclass(frozen=True)
class Served:
    install: PerfAnalyzerInstall
    server: ServerProcess
    grpc: str


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    install = perf_analyzer_install()
    if isinstance(install, str):
        pytest.skip(f"perf_analyzer unavailable: {install}")
    repo = tmp_path_factory.mktemp("repo")
    write_config(repo / "identity", _config("identity"))
    (repo / "identity" / "1").mkdir()
    (repo / "identity" / "1" / "model.py").write_text(IDENTITY)
    write_python_backend_model(repo, _config("repeat", decoupled=True), REPEAT)
    grpc_port = free_port()
    server = start_server(repo, tmp_path_factory.mktemp("log"), "--grpc-port", str(grpc_port))
    try:
        yield Served(install, server, f"127.0.0.1:{grpc_port}")
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("protocol", "is_async", "shared_memory"),
    [
        pytest.param("http", False, "none", id="http"),
        pytest.param("grpc", False, "none", id="grpc"),
        pytest.param("grpc", True, "none", id="grpc-async"),
        pytest.param("http", False, "system", id="http-shared-memory"),
        pytest.param("grpc", False, "system", id="grpc-shared-memory"),
    ],
)
def test_perf_analyzer_measures_without_error(
    served: Served, protocol: str, is_async: bool, shared_memory: str
) -> None:
    url = served.server.address if protocol == "http" else served.grpc
    point = run_point(
        served.install,
        model="identity",
        url=url,
        protocol="http" if protocol == "http" else "grpc",
        concurrency=2,
        request_count=REQUESTS,
        is_async=is_async,
        shared_memory="system" if shared_memory == "system" else "none",
        timeout_s=TIMEOUT_S,
    )
    assert point.concurrency == 2
    assert point.infer_per_s > 0
    assert point.p50_us > 0


def test_perf_analyzer_streams_a_decoupled_model(served: Served) -> None:
    point = run_point(
        served.install,
        model="repeat",
        url=served.grpc,
        protocol="grpc",
        request_count=REQUESTS,
        is_streaming=True,
        timeout_s=TIMEOUT_S,
    )
    assert point.infer_per_s > 0
    stats = httpx.get(f"{served.server.url}/v2/models/repeat/stats", timeout=TIMEOUT_S).json()
    inference = stats["model_stats"][0]["inference_stats"]
    # Every streamed request was answered: a success, none a failure (perf_analyzer itself
    # refuses statistics that say otherwise).
    assert inference["fail"]["count"] == 0
    assert inference["success"]["count"] >= REQUESTS
