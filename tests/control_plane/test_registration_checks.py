"""Registrations checked against the stored model, through the admin API in process.

Each broken layout is a real folder on disk; the admin API (with the real inspector over
local files) must refuse it with 422 and register nothing, and a real data plane, in
process, loading the same folder must fail with the very same words.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from control_plane.activation import Orchestrator
from control_plane.api.app import create_app
from control_plane.api.service import AdminService
from control_plane.backends.base import PoolSpec
from control_plane.inspection.inspector import RegistrationInspector
from control_plane.metrics import ControlPlaneMetrics
from control_plane.placement import Placer
from control_plane.store.memory import MemoryStateStore
from control_plane.worker_client import load_body
from foundation.records import ModelRecord
from runtimes.registry import available_backends
from tests.control_plane.fakes import Acting, FakeBackend, FakeWorkers, lifespan, make_settings
from tests.data_plane.server_app import data_plane
from tests.models import make_config, write_config, write_onnx_mlp

pytestmark = pytest.mark.anyio

TOKEN = "test-admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@dataclass
class Admin:
    client: httpx.AsyncClient
    store: MemoryStateStore
    root: Path

    async def register(self, name: str, path: Path | str, **fields: Any) -> httpx.Response:
        body = {"name": name, "storage_uri": str(path), **fields}
        return await self.client.post("/admin/v1/models", json=body, headers=AUTH)


@contextlib.asynccontextmanager
async def admin_api(root: Path) -> AsyncIterator[Admin]:
    settings = make_settings(allowed_storage=(str(root),))
    store = MemoryStateStore()
    backend = FakeBackend()
    pool = PoolSpec(name=settings.pool, max_workers=2)
    await backend.ensure_pool(pool)
    acting = Acting()
    registry = CollectorRegistry()
    placer = Placer(store, backend, pool, FakeWorkers(), settings)
    orchestrator = Orchestrator(store, placer, settings, ControlPlaneMetrics(registry), acting)
    backends = available_backends()
    inspector = RegistrationInspector(
        allowed_storage=settings.allowed_storage,
        allow_model_code=True,
        pool_of=lambda record: (settings.pool, backends),
        timeout_s=30.0,
    )
    service = AdminService(store, orchestrator, placer, backend, acting, inspector=inspector)
    app = create_app(
        service,
        token=TOKEN,
        registry=registry,
        acting=acting,
        allowed_storage=settings.allowed_storage,
        allow_model_code=True,
    )
    try:
        async with lifespan(app) as served:
            transport = httpx.ASGITransport(app=served, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
                yield Admin(client, store, root)
    finally:
        inspector.close()
        await orchestrator.close()
        await placer.close()
        await store.close()


# ---- the broken layouts ----


def _missing_folder(root: Path) -> Path:
    return root / "nowhere"


def _no_model(root: Path) -> Path:
    folder = root / "readme_only"
    folder.mkdir()
    (folder / "README.md").write_text("nothing to serve\n")
    return folder


def _config_without_version(root: Path) -> Path:
    folder = root / "no_version"
    write_config(folder, make_config("no_version", backend="onnxruntime"))
    return folder


def _empty_version_of_onnx(root: Path) -> Path:
    folder = root / "empty_version"
    write_config(folder, make_config("empty_version", backend="onnxruntime"))
    (folder / "1").mkdir()
    return folder


def _empty_version_no_backend(root: Path) -> Path:
    folder = root / "empty_unknown"
    (folder / "1").mkdir(parents=True)
    return folder


def _unknown_backend(root: Path) -> Path:
    folder = write_onnx_mlp(root, "unknown_backend")
    (folder / "config.pbtxt").write_text('backend: "tensorflow"\nmax_batch_size: 8\n')
    return folder


def _unknown_platform(root: Path) -> Path:
    folder = write_onnx_mlp(root, "unknown_platform")
    (folder / "config.pbtxt").write_text('platform: "tensorrt_plan"\n')
    return folder


def _unparsable_config(root: Path) -> Path:
    folder = write_onnx_mlp(root, "unparsable")
    (folder / "config.pbtxt").write_text('backend: "onnxruntime"\ninput [ { name: "x" \n')
    return folder


def _input_the_graph_lacks(root: Path) -> Path:
    folder = write_onnx_mlp(root, "bogus_input", sizes=(4, 8, 3))
    write_config(
        folder,
        make_config(
            "bogus_input",
            backend="onnxruntime",
            inputs=[("not_an_input", "FP32", [4])],
            outputs=[("OUTPUT0", "FP32", [3])],
        ),
    )
    return folder


def _output_of_another_type(root: Path) -> Path:
    folder = write_onnx_mlp(root, "wrong_type", sizes=(4, 8, 3))
    write_config(
        folder,
        make_config(
            "wrong_type",
            backend="onnxruntime",
            inputs=[("INPUT0", "FP32", [4])],
            outputs=[("OUTPUT0", "INT32", [3])],
        ),
    )
    return folder


def _not_onnx(root: Path) -> Path:
    folder = root / "garbage"
    write_config(folder, make_config("garbage", backend="onnxruntime"))
    (folder / "1").mkdir()
    (folder / "1" / "model.onnx").write_bytes(b"\xff\xff\xff\xff not a protobuf at all")
    return folder


def _missing_version_of_policy(root: Path) -> Path:
    folder = write_onnx_mlp(root, "policy")
    (folder / "config.pbtxt").write_text(
        'backend: "onnxruntime"\nversion_policy { specific { versions: [7] } }\n'
    )
    return folder


def _missing_label_file(root: Path) -> Path:
    folder = write_onnx_mlp(root, "labels", sizes=(4, 8, 3))
    (folder / "config.pbtxt").write_text(
        'backend: "onnxruntime"\nmax_batch_size: 8\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 3 ] '
        'label_filename: "labels.txt" } ]\n'
    )
    return folder


def _hf_without_weights(root: Path) -> Path:
    folder = root / "hf_no_weights"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (folder / "tokenizer.json").write_text("{}")
    return folder


def _hf_without_architectures(root: Path) -> Path:
    folder = root / "hf_no_arch"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "model.safetensors").write_bytes(b"\0" * 16)
    return folder


BROKEN: list[Any] = [
    pytest.param(_missing_folder, None, "no such file or folder", id="missing-folder"),
    pytest.param(_no_model, None, "no model here", id="folder-without-a-model"),
    pytest.param(_config_without_version, None, "no model here", id="no-version-folder"),
    pytest.param(_empty_version_of_onnx, None, "model.onnx does not exist", id="empty-version"),
    pytest.param(
        _empty_version_no_backend,
        None,
        "no backend or platform in the configuration and no model file",
        id="empty-version-no-config",
    ),
    pytest.param(_unknown_backend, None, "unknown backend 'tensorflow'", id="unknown-backend"),
    pytest.param(
        _unknown_platform, None, "unsupported platform 'tensorrt_plan'", id="unknown-platform"
    ),
    pytest.param(_unparsable_config, None, "failed to poll", id="unparsable-config"),
    pytest.param(
        _input_the_graph_lacks,
        None,
        "configuration input 'not_an_input' is not a model input",
        id="input-the-onnx-model-lacks",
    ),
    pytest.param(
        _output_of_another_type,
        None,
        "configuration output 'OUTPUT0' is TYPE_INT32 but the model has tensor(float)",
        id="output-of-another-type",
    ),
    pytest.param(_not_onnx, None, "cannot read model.onnx as ONNX", id="file-not-onnx"),
    pytest.param(
        _missing_version_of_policy,
        None,
        "at least one version must be available",
        id="version-policy-selects-nothing",
    ),
    pytest.param(_missing_label_file, None, "label file 'labels.txt' not found", id="no-labels"),
    pytest.param(
        _hf_without_weights, None, "holds no *.safetensors weights", id="hf-without-weights"
    ),
    pytest.param(
        _hf_without_architectures,
        None,
        "config.json has no 'architectures' list",
        id="hf-without-architectures",
    ),
    pytest.param(
        lambda root: write_onnx_mlp(root, "config_backend", config=False),
        {"backend": "tensorflow"},
        "unknown backend 'tensorflow'",
        id="registration-config-names-unknown-backend",
    ),
]


@pytest.mark.parametrize(("make", "config", "expected"), BROKEN)
async def test_a_broken_model_is_refused_with_422_and_nothing_is_registered(
    tmp_path: Path, make: Callable[[Path], Path], config: dict[str, Any] | None, expected: str
):
    root = tmp_path / "models"
    root.mkdir()
    folder = make(root)
    fields = {"config": config} if config is not None else {}
    async with admin_api(root) as admin:
        response = await admin.register("m", folder, **fields)
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert expected in error
        assert "'m'" in error  # names the model, as the worker does
        assert (await admin.client.get("/admin/v1/models/m", headers=AUTH)).status_code == 404
        dry = await admin.client.post(
            "/admin/v1/models?dry_run=true",
            json={"name": "m", "storage_uri": str(folder), **fields},
            headers=AUTH,
        )
        assert dry.status_code == 422
        assert dry.json()["error"] == error


async def test_the_refusal_is_what_a_worker_says_when_it_loads_the_same_folder(tmp_path: Path):
    root = tmp_path / "models"
    root.mkdir()
    cases = [(p.values[0], p.values[1], p.id) for p in BROKEN]
    made = [(make(root), config, case_id) for make, config, case_id in cases]
    repository = tmp_path / "repository"
    repository.mkdir()
    async with admin_api(root) as admin:
        refusals = {}
        for folder, config, case_id in made:
            fields = {"config": config} if config is not None else {}
            response = await admin.register("m", folder, **fields)
            assert response.status_code == 422, case_id
            refusals[case_id] = response.json()["error"]
    async with data_plane(repository, tmp_path / "cache", allowed_storage=(str(root),)) as worker:
        for folder, config, case_id in made:
            record = ModelRecord(name="m", storage_uri=str(folder), config=config)
            response = await worker.post("/v2/repository/models/m/load", json=load_body(record))
            assert response.status_code == 400, (case_id, response.text)
            assert response.json()["error"] == refusals[case_id], case_id


async def test_a_good_model_registers_and_a_dry_run_registers_nothing(tmp_path: Path):
    root = tmp_path / "models"
    folder = write_onnx_mlp(root, "good", sizes=(4, 8, 3))
    async with admin_api(root) as admin:
        dry = await admin.client.post(
            "/admin/v1/models?dry_run=true",
            json={"name": "good", "storage_uri": str(folder)},
            headers=AUTH,
        )
        assert dry.status_code == 200, dry.text
        assert dry.json()["name"] == "good"
        assert await admin.store.get_model("good") is None
        registered = await admin.register("good", folder)
        assert registered.status_code == 201, registered.text
        assert await admin.store.get_model("good") is not None


async def test_a_change_to_a_broken_location_is_refused_and_the_record_kept(tmp_path: Path):
    root = tmp_path / "models"
    good = write_onnx_mlp(root, "good", sizes=(4, 8, 3))
    broken = _unknown_backend(root)
    async with admin_api(root) as admin:
        assert (await admin.register("good", good)).status_code == 201
        before = await admin.store.get_model("good")
        for query in ("", "?dry_run=true"):
            response = await admin.client.patch(
                f"/admin/v1/models/good{query}", json={"storage_uri": str(broken)}, headers=AUTH
            )
            assert response.status_code == 422, response.text
            assert "unknown backend 'tensorflow'" in response.json()["error"]
        assert await admin.store.get_model("good") == before
        moved = write_onnx_mlp(root, "moved", sizes=(4, 8, 3))
        dry = await admin.client.patch(
            "/admin/v1/models/good?dry_run=true", json={"storage_uri": str(moved)}, headers=AUTH
        )
        assert dry.status_code == 200 and dry.json()["storage_uri"] == str(moved)
        assert await admin.store.get_model("good") == before
        changed = await admin.client.patch(
            "/admin/v1/models/good", json={"storage_uri": str(moved)}, headers=AUTH
        )
        assert changed.status_code == 200
        stored = await admin.store.get_model("good")
        assert stored is not None and stored.storage_uri == str(moved)


async def test_a_backend_the_pool_cannot_run_is_refused(tmp_path: Path):
    root = tmp_path / "models"
    folder = root / "hf"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (folder / "model.safetensors").write_bytes(b"\0" * 16)
    missing = sorted({"vllm", "transformers"} - set(available_backends()))
    if not missing:
        pytest.skip("every LLM backend is installed here")
    async with admin_api(root) as admin:
        response = await admin.register("llm", folder, config={"backend": missing[0]})
        assert response.status_code == 422, response.text
        assert (
            f"backend '{missing[0]}' is not available on the workers of pool"
            in (response.json()["error"])
        )
