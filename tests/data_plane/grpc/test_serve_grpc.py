"""``zeroserve serve --grpc-port`` (on each ``--grpc-frontend``), a real process:
tritonclient.grpc answered beside HTTP, one shared-memory registry, trace manager and log
control for both, and a clean stop on SIGTERM that frees the port."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import numpy as np
import pytest

grpcclient = pytest.importorskip("tritonclient.grpc")
httpclient = pytest.importorskip("tritonclient.http")
shm = pytest.importorskip("tritonclient.utils.shared_memory")

from data_plane.grpc.server import check_port  # noqa: E402
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
