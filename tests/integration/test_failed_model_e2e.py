"""A model whose load fails for good, through a real ``zeroserve up``: the first call
starts one activation, every call is answered at once with the worker's reason and a
status clients do not retry, and nothing is loaded again until the registration changes
or an explicit ``models load``. A broken folder is refused at registration.
"""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.integration.conftest import free_port
from tests.integration.test_platform_e2e import (
    AUTH,
    REQUEST_TIMEOUT_S,
    admin_get,
    cli,
    start_platform,
)
from tests.models import write_python_model

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

BROKEN_SOURCE = """\
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("lookup table tokens.bin is missing; run prepare.sh")

    def execute(self, inputs):
        return {"OUTPUT0": inputs["INPUT0"] * 2}
"""
FIXED_SOURCE = BROKEN_SOURCE.replace(
    'raise RuntimeError("lookup table tokens.bin is missing; run prepare.sh")', "pass"
)
REASON = "lookup table tokens.bin is missing; run prepare.sh"


def _body(values: list[float]) -> dict[str, object]:
    return {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [len(values)], "data": values}]
    }


async def test_a_model_failing_at_load_is_activated_once_and_answered_at_once(tmp_path: Path):
    # Auth: the platform starts as it does today (no per-model keys in this branch).
    grpc_port = free_port()
    platform = start_platform(tmp_path, "failing", "--grpc-port", str(grpc_port))
    try:
        broken = write_python_model(
            platform.models_dir, "broken", textwrap.dedent(BROKEN_SOURCE), max_batch_size=0
        )
        async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as client:
            # A folder no worker could load is refused before anything is registered.
            nowhere = await client.post(
                f"{platform.admin}/admin/v1/models",
                json={"name": "nowhere", "storage_uri": str(platform.models_dir / "nowhere")},
                headers=AUTH,
            )
            assert nowhere.status_code == 422, nowhere.text
            assert "no such file or folder" in nowhere.json()["error"]

            created = await client.post(
                f"{platform.admin}/admin/v1/models",
                json={"name": "broken", "storage_uri": str(broken)},
                headers=AUTH,
            )
            assert created.status_code == 201, created.text

            url = f"{platform.public}/v2/models/broken/infer"
            burst = await asyncio.gather(*(client.post(url, json=_body([1.0])) for _ in range(8)))
            after = [await client.post(url, json=_body([1.0])) for _ in range(8)]
            for response in (*burst, *after):
                assert response.status_code == 424, response.text
                assert "retry-after" not in response.headers
                assert REASON in response.json()["error"]

            # Over gRPC too: FAILED_PRECONDITION, which gRPC retry policies do not retry.
            grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
            try:
                inputs = [grpcclient.InferInput("INPUT0", [1], "FP32")]
                inputs[0].set_data_from_numpy(np.array([1.0], dtype=np.float32))
                with pytest.raises(InferenceServerException) as caught:
                    grpc.infer("broken", inputs, client_timeout=REQUEST_TIMEOUT_S)
                assert not grpc.is_model_ready("broken")
            finally:
                grpc.close()
            assert caught.value.status() == "StatusCode.FAILED_PRECONDITION"
            assert REASON in (caught.value.message() or "")

            timelines = (await admin_get(client, platform, "/models/broken/activations"))[
                "activations"
            ]
            assert len(timelines) == 1, timelines
            assert timelines[0]["outcome"] == "failed" and timelines[0]["is_permanent"]
            assert timelines[0]["trigger"] == "request"
            view = await admin_get(client, platform, "/models/broken")
            assert view["status"]["state"] == "failed"
            assert REASON in view["status"]["failure"]["reason"]

            code, out = await cli(platform, "ls")
            assert code == 0 and "failed" in out and REASON in out, out

            # An explicit load tries again, once, and says why it failed.
            code, out = await cli(platform, "load", "broken")
            assert code == 1 and "424" in out and REASON in out, out
            timelines = (await admin_get(client, platform, "/models/broken/activations"))[
                "activations"
            ]
            assert len(timelines) == 2

            # A change of registration clears the failure: the fixed copy serves.
            fixed = write_python_model(
                platform.models_dir, "fixed", textwrap.dedent(FIXED_SOURCE), max_batch_size=0
            )
            changed = await client.patch(
                f"{platform.admin}/admin/v1/models/broken",
                json={"storage_uri": str(fixed)},
                headers=AUTH,
            )
            assert changed.status_code == 200, changed.text
            assert changed.json()["status"]["failure"] is None
            # The activator trusts its cached lookup of the model for a moment.
            deadline = asyncio.get_running_loop().time() + REQUEST_TIMEOUT_S
            while True:
                served = await client.post(url, json=_body([1.5, 2.0]))
                if served.status_code != 424 or asyncio.get_running_loop().time() > deadline:
                    break
                await asyncio.sleep(0.2)
            assert served.status_code == 200, served.text
            output = served.json()["outputs"][0]
            np.testing.assert_allclose(output["data"], [3.0, 4.0])
    finally:
        platform.stop()
        leftovers = platform.wait_workers_gone()
        platform.kill_leftovers()
        assert not leftovers, f"orphan workers {leftovers}:\n{platform.log()}"
