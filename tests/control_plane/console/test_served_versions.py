"""The versions a ready replica serves, on the one-model page and in the admin API's view of
one model: asked of a real data plane worker on loopback (its ``GET /v2/models/{name}``)."""

from __future__ import annotations

import re
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from control_plane.worker_client import WorkerClient
from tests.control_plane.console.test_console_app import log_in
from tests.control_plane.test_api import AUTH, Api, running_api
from tests.data_plane.llm_app import llm_server
from tests.models import read_config, write_config, write_onnx_mlp

pytestmark = pytest.mark.anyio


def _served(page: str) -> str:
    found = re.search(r'<td id="served-versions">(.*?)</td>', page, re.S)
    assert found is not None
    return re.sub(r"<[^>]+>", "", found.group(1)).strip()


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    client = WorkerClient(load_timeout_s=5.0, unload_timeout_s=5.0)
    try:
        async with running_api(versions=client) as served:
            yield served
    finally:
        await client.close()


async def test_the_versions_a_loaded_model_serves_then_none_once_scaled_to_zero(
    api: Api, tmp_path: Path
):
    repo = tmp_path / "repo"
    write_onnx_mlp(repo, "m", version=1)
    model_dir = write_onnx_mlp(repo, "m", version=2)
    config = read_config(model_dir)
    config.version_policy.all.SetInParent()
    write_config(model_dir, config)
    async with llm_server(repo, tmp_path / "cache", models=("m",)) as worker:
        api.backend.urls.append(str(worker.client.base_url).rstrip("/"))
        cookie = await log_in(api)
        await api.register("m")
        before = await api.client.get("/console/models/m", headers=cookie)
        assert _served(before.text) == "none loaded"

        assert (await api.client.post("/admin/v1/models/m/load", headers=AUTH)).status_code == 200
        page = await api.client.get("/console/models/m", headers=cookie)
        assert page.status_code == 200
        assert _served(page.text) == "1, 2"
        view = (await api.client.get("/admin/v1/models/m", headers=AUTH)).json()
        assert view["status"]["served_versions"] == ["1", "2"]
        # Lists ask no worker.
        (listed,) = (await api.client.get("/admin/v1/models", headers=AUTH)).json()["models"]
        assert listed["status"]["served_versions"] is None

        unloaded = await api.client.post("/admin/v1/models/m/unload", headers=AUTH)
        assert unloaded.status_code == 200
        assert unloaded.json()["status"]["served_versions"] is None
        page = await api.client.get("/console/models/m", headers=cookie)
        assert _served(page.text) == "none loaded"


async def test_a_worker_that_does_not_answer_leaves_the_versions_not_available(api: Api):
    # Listening, never accepting: the request is sent and no answer ever comes.
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        api.backend.urls.append(f"http://127.0.0.1:{port}")
        cookie = await log_in(api)
        await api.register("m")
        assert (await api.client.post("/admin/v1/models/m/load", headers=AUTH)).status_code == 200
        page = await api.client.get("/console/models/m", headers=cookie)
        assert page.status_code == 200
        assert _served(page.text).startswith("not available")
        assert "w1" in page.text  # the replica itself is still shown
        view = (await api.client.get("/admin/v1/models/m", headers=AUTH)).json()
        assert view["status"]["state"] == "ready"
        assert view["status"]["served_versions"] is None
