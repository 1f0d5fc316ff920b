"""The activator's routes in process: what it answers itself, and how it refuses."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator

import pytest

from activator.app import ActivatorStore, create_app
from activator.settings import ActivatorSettings
from control_plane.store.base import StateStore
from foundation.errors import ModelFailedError
from foundation.records import ModelFailure, ModelRecord
from tests.activator.conftest import asgi_client
from tests.activator.fakes import FakeStore, RecordingActivate

pytestmark = pytest.mark.anyio


def _settings(**overrides: object) -> ActivatorSettings:
    return ActivatorSettings(startup_sync_timeout_s=5.0, auth="off").model_copy(update=overrides)


def test_the_state_store_is_an_activator_store() -> None:
    # Checked by mypy, not at run time: StateStore has every method the activator uses.
    def accepts(store: StateStore) -> ActivatorStore:
        return store

    del accepts


async def test_health_and_server_metadata() -> None:
    app = create_app(_settings(), FakeStore(), RecordingActivate(), "act-1")
    async with asgi_client(app) as client:
        assert (await client.get("/v2/health/live")).status_code == 200
        assert (await client.get("/v2/health/ready")).status_code == 200
        meta = (await client.get("/v2")).json()
        assert meta["name"] == "triton"
        assert "binary_tensor_data" in meta["extensions"]
        assert "model_repository" not in meta["extensions"]


async def test_not_ready_before_the_first_placement_list() -> None:
    class _Silent(FakeStore):
        async def list_placements(self, model=None):
            await asyncio.Event().wait()  # never answers
            return []

    app = create_app(_settings(startup_sync_timeout_s=0), _Silent(), RecordingActivate(), "a")
    async with asgi_client(app) as client:
        response = await client.get("/v2/health/ready")
        assert response.status_code == 400
        assert response.content == b""


@pytest.mark.parametrize(
    ("method", "path"),
    [
        pytest.param("POST", "/v2/models/nope/infer", id="infer"),
        pytest.param("GET", "/v2/models/nope", id="metadata"),
        pytest.param("GET", "/v2/models/nope/versions/1/config", id="version-config"),
        pytest.param("GET", "/v2/models/nope/ready", id="ready"),
    ],
)
async def test_unknown_models_are_404_and_wake_nothing(method: str, path: str) -> None:
    activate = RecordingActivate()
    app = create_app(_settings(), FakeStore(), activate, "act-1")
    async with asgi_client(app) as client:
        response = await client.request(method, path, content=b"{}")
    assert response.status_code == 404
    assert response.json() == {"error": "model 'nope' is not registered"}
    assert activate.calls == []


async def test_unknown_openai_model_is_404_and_wakes_nothing() -> None:
    activate = RecordingActivate()
    app = create_app(_settings(), FakeStore(), activate, "act-1")
    async with asgi_client(app) as client:
        response = await client.post("/v1/completions", json={"prompt": "hi", "model": "nope"})
    assert response.status_code == 404
    # OpenAI's error object on the OpenAI paths, so that its clients read it.
    assert response.json() == {
        "error": {
            "message": "model 'nope' is not registered",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    }
    assert activate.calls == []


async def test_a_registered_model_is_ready_at_zero_replicas_without_waking() -> None:
    store, activate = FakeStore(), RecordingActivate()
    store.register("mlp")
    app = create_app(_settings(), store, activate, "act-1")
    async with asgi_client(app) as client:
        assert (await client.get("/v2/models/mlp/ready")).status_code == 200
        assert (await client.get("/v2/models/mlp/versions/3/ready")).status_code == 200
    assert activate.calls == []


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param(b"{nope", "request body is not valid JSON", id="not-json"),
        pytest.param(b"[1, 2]", 'request body has no "model" string', id="not-an-object"),
        pytest.param(b'{"prompt": "hi"}', 'request body has no "model" string', id="no-model"),
        pytest.param(b'{"model": 3}', 'request body has no "model" string', id="not-a-string"),
        pytest.param(b'{"model": ""}', 'request body has no "model" string', id="empty"),
    ],
)
async def test_openai_bodies_without_a_model_are_400(body: bytes, message: str) -> None:
    app = create_app(_settings(), FakeStore(), RecordingActivate(), "act-1")
    async with asgi_client(app) as client:
        response = await client.post("/v1/chat/completions", content=body)
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith(message)
    assert response.json()["error"]["type"] == "invalid_request_error"


async def test_bodies_over_the_limit_are_413() -> None:
    store = FakeStore()
    store.register("mlp")
    app = create_app(_settings(max_request_bytes=10), store, RecordingActivate(), "act-1")
    async with asgi_client(app) as client:
        declared = await client.post("/v2/models/mlp/infer", content=b"x" * 11)

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(3):
                yield b"xxxx"

        streamed = await client.post("/v2/models/mlp/infer", content=chunks())
    assert declared.status_code == 413
    assert declared.json() == {"error": "request body of 11 bytes exceeds the limit of 10 bytes"}
    assert streamed.status_code == 413
    assert streamed.json() == {"error": "request body of 12 bytes exceeds the limit of 10 bytes"}


async def test_openai_model_list_comes_from_the_registry() -> None:
    store = FakeStore()
    store.register("a")
    store.register("b")
    app = create_app(_settings(), store, RecordingActivate(), "act-1")
    async with asgi_client(app) as client:
        listing = (await client.get("/v1/models")).json()
    assert listing["object"] == "list"
    assert [m["id"] for m in listing["data"]] == ["a", "b"]
    assert listing["data"][0]["object"] == "model"


async def test_unknown_paths_and_methods_answer_json() -> None:
    app = create_app(_settings(), FakeStore(), RecordingActivate(), "act-1")
    async with asgi_client(app) as client:
        missing = await client.get("/v2/repository/index")
        wrong_method = await client.get("/v1/completions")
    assert missing.status_code == 404
    assert missing.json() == {"error": "Not Found"}
    assert wrong_method.status_code == 405
    assert wrong_method.json() == {"error": "Method Not Allowed"}


async def test_a_store_outage_on_lookup_is_503_with_retry_after() -> None:
    store = FakeStore()
    store.get_model_error = ConnectionError("down")
    app = create_app(_settings(retry_after_s=7), store, RecordingActivate(), "act-1")
    async with asgi_client(app) as client:
        response = await client.post("/v2/models/mlp/infer", content=b"{}")
    assert response.status_code == 503
    assert response.headers["retry-after"] == "7"
    assert "state store unavailable" in response.json()["error"]


async def test_compressed_openai_bodies_are_refused() -> None:
    app = create_app(_settings(), FakeStore(), RecordingActivate(), "act-1")
    async with asgi_client(app) as client:
        response = await client.post(
            "/v1/completions",
            content=gzip.compress(b'{"model": "m"}'),
            headers={"Content-Encoding": "gzip"},
        )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["message"] == "Content-Encoding 'gzip' is not supported on this path"


async def test_unexpected_errors_are_500_without_details(caplog: pytest.LogCaptureFixture) -> None:
    class _Broken(FakeStore):
        async def list_models(self) -> list[ModelRecord]:
            raise RuntimeError("secret detail")

    app = create_app(_settings(), _Broken(), RecordingActivate(), "act-1")
    async with asgi_client(app, raise_app_exceptions=False) as client:
        response = await client.get("/v1/models")
    assert response.status_code == 500
    assert response.json() == {"error": "internal server error"}
    assert "secret detail" in caplog.text  # in the log only


async def test_a_failed_model_is_answered_at_once_and_wakes_nothing() -> None:
    store, activate = FakeStore(), RecordingActivate()
    store.models["broken"] = ModelRecord(
        name="broken",
        storage_uri="file:///models/broken",
        failure=ModelFailure(reason="config.pbtxt does not parse", failed_at=1.0),
    )
    app = create_app(_settings(), store, activate, "act-1")
    async with asgi_client(app) as client:
        infer = await client.post("/v2/models/broken/infer", json={"inputs": []})
        assert infer.status_code == 424
        assert "retry-after" not in infer.headers
        assert infer.json()["error"].endswith(": config.pbtxt does not parse")
        chat = await client.post("/v1/chat/completions", json={"model": "broken"})
        assert chat.status_code == 424
        assert chat.json()["error"]["code"] == "model_failed"
        # Not ready, in Triton's words (400), rather than an error.
        assert (await client.get("/v2/models/broken/ready")).status_code == 400
    assert activate.calls == []


async def test_a_failure_learnt_from_an_activation_answers_the_next_calls_at_once() -> None:
    store = FakeStore()
    store.register("m")
    failure = ModelFailedError(model="m", reason="initialize raised", failed_at=2.0)
    activate = RecordingActivate(error=failure)
    # A long cache: only the activation's answer can tell the activator of the failure.
    app = create_app(_settings(model_cache_ttl_s=3600.0), store, activate, "act-1")
    async with asgi_client(app) as client:
        assert (await client.get("/v2/models/m/ready")).status_code == 200
        first = await client.post("/v2/models/m/infer", json={"inputs": []})
        assert first.status_code == 424
        assert first.json()["error"].endswith(": initialize raised")
        again = await client.post("/v2/models/m/infer", json={"inputs": []})
        assert again.status_code == 424
        assert (await client.get("/v2/models/m/ready")).status_code == 400
    assert activate.calls == ["m"]
