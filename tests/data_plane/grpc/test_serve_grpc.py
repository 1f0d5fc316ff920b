"""``zeroserve serve --grpc-port`` (on each ``--grpc-frontend``), a real process:
tritonclient.grpc answered beside HTTP, one shared-memory registry, trace manager and log
control for both, and a clean stop on SIGTERM that frees the port."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import httpx
import numpy as np
import pytest

grpcclient = pytest.importorskip("tritonclient.grpc")
httpclient = pytest.importorskip("tritonclient.http")
shm = pytest.importorskip("tritonclient.utils.shared_memory")

from tritonclient.utils import InferenceServerException  # noqa: E402

from data_plane.grpc.server import check_port  # noqa: E402
from foundation.grpc_front.web import CONTENT_TYPE, parse_answer, request_body  # noqa: E402
from foundation.proto import grpc_service_pb2 as pb  # noqa: E402
from tests.integration.conftest import start_server  # noqa: E402
from tests.models import write_onnx_add_sub  # noqa: E402
from tests.triton_oracle import free_ports  # noqa: E402

pytestmark = pytest.mark.integration

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


def wait_ready(client: object) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        try:
            if client.is_server_ready():  # type: ignore[attr-defined]
                return
        except Exception:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise TimeoutError(f"gRPC not ready within {READY_TIMEOUT_S} s")
        time.sleep(0.1)


@pytest.mark.parametrize("frontend", ["aio", "h2corn"])
def test_serve_answers_grpc_and_stops_on_sigterm(tmp_path: Path, frontend: str) -> None:
    repo = tmp_path / "repo"
    write_onnx_add_sub(repo, "simple", dtype="INT32", dims=(16,), max_batch_size=8)
    [grpc_port] = free_ports(1)
    server = start_server(
        repo, tmp_path, "--grpc-port", str(grpc_port), "--grpc-frontend", frontend
    )
    key = f"/zs-serve-grpc-{uuid.uuid4().hex[:8]}"
    region = shm.create_shared_memory_region("inputs", key, 128)
    try:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        wait_ready(client)
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(a)
        np.testing.assert_array_equal(client.infer("simple", inputs).as_numpy("OUTPUT0"), a + a)

        # A region registered over HTTP serves a gRPC request: one registry for both.
        shm.set_shared_memory_region(region, [a, a])
        http = httpclient.InferenceServerClient(server.address)
        http.register_system_shared_memory("inputs", key, 128)
        http.close()
        assert "inputs" in client.get_system_shared_memory_status(as_json=True)["regions"]
        inputs[0].set_shared_memory("inputs", 64)
        inputs[1].set_shared_memory("inputs", 64, offset=64)
        np.testing.assert_array_equal(client.infer("simple", inputs).as_numpy("OUTPUT1"), a - a)

        # One trace manager and one log control behind both transports, too.
        http = httpclient.InferenceServerClient(server.address)
        http.update_trace_settings(model_name="simple", settings={"trace_rate": "7"})
        http.close()
        traced = client.get_trace_settings(model_name="simple", as_json=True)["settings"]
        assert traced["trace_rate"]["value"] == ["7"]
        logging_now = client.update_log_settings({"log_verbose_level": 1}, as_json=True)
        assert logging_now["settings"]["log_verbose_level"] == {"uint32_param": 1}
        client.close()

        assert server.stop(STOP_TIMEOUT_S) == 0
        check_port("127.0.0.1", grpc_port)  # freed
        log = server.log()
        assert "gRPC server listening" in log
        assert "gRPC server stopped" in log
    finally:
        server.stop(STOP_TIMEOUT_S)
        shm.destroy_shared_memory_region(region)


def test_the_http_port_answers_grpc_web_as_the_grpc_port_answers_grpc(tmp_path: Path) -> None:
    """What the activator sends workers' unary calls as: the same service, statistics and
    statuses on the HTTP port; a request that is not gRPC-Web there is HTTP's as before."""
    repo = tmp_path / "repo"
    write_onnx_add_sub(repo, "simple", dtype="INT32", dims=(16,), max_batch_size=8)
    [grpc_port] = free_ports(1)
    server = start_server(repo, tmp_path, "--grpc-port", str(grpc_port))
    try:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        wait_ready(client)
        request = pb.ModelInferRequest(model_name="simple", id="web-1")
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        for name in ("INPUT0", "INPUT1"):
            tensor = request.inputs.add(name=name, datatype="INT32")
            tensor.shape.extend([1, 16])
            request.raw_input_contents.append(a.tobytes())
        path = "/inference.GRPCInferenceService/ModelInfer"
        headers = {"content-type": CONTENT_TYPE.decode(), "grpc-timeout": "30S"}
        with httpx.Client(base_url=f"http://{server.address}", timeout=READY_TIMEOUT_S) as http:
            answered = http.post(
                path, content=request_body(request.SerializeToString()), headers=headers
            )
            assert answered.status_code == 200
            answer = parse_answer(answered.content, 1 << 20)
            assert answer.code.name == "OK"
            [message] = answer.messages
            response = pb.ModelInferResponse.FromString(message)
            assert (response.model_name, response.id) == ("simple", "web-1")
            sums = np.frombuffer(response.raw_output_contents[0], dtype=np.int32)
            np.testing.assert_array_equal(sums, (a + a).ravel())

            missing = pb.ModelInferRequest(model_name="nope")
            refused = http.post(
                path, content=request_body(missing.SerializeToString()), headers=headers
            )
            refusal = parse_answer(refused.content, 1 << 20)
            with pytest.raises(InferenceServerException) as grpc_refusal:
                client.infer("nope", [])
            assert refusal.code.name == grpc_refusal.value.status().rsplit(".", 1)[-1]
            assert refusal.message == grpc_refusal.value.message()

            # Not gRPC-Web: the HTTP API's own answer for an unknown path.
            assert http.post(path, content=b"{}").status_code == 404
        stats = client.get_inference_statistics("simple", as_json=True)
        assert stats["model_stats"][0]["inference_stats"]["success"]["count"] == "1"
        client.close()
    finally:
        server.stop(STOP_TIMEOUT_S)
