"""A plain Hugging Face folder (the tiny Llama as ``save_pretrained`` wrote it: no
config.pbtxt, no version folder) in ``zeroserve serve``'s repository, served in process as an
LLM on the OpenAI routes and Triton's generate; and folders that are not causal LMs, refused
with a load error that says why."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.data_plane.llm_app import LlmServer, llm_app
from tests.llm_model import prompt, write_hf_folder

pytestmark = pytest.mark.anyio

PROMPT = prompt("the", "fox", "dog", "river")


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # module scope: one server (one model load) for the module's tests


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    folder = write_hf_folder(root, "tiny")
    assert not (folder / "config.pbtxt").exists() and (folder / "config.json").is_file()
    for name, architectures, weights in (
        ("encoder", ["BertModel"], True),
        ("no-weights", ["LlamaForCausalLM"], False),
    ):
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps({"architectures": architectures}))
        if weights:
            (root / name / "model.safetensors").write_bytes(b"")
    return root


@pytest.fixture(scope="module")
async def server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LlmServer]:
    async with llm_app(repo, tmp_path_factory.mktemp("cache"), models=("tiny",)) as app:
        yield app


async def test_served_on_the_openai_routes_and_triton_generate(server: LlmServer) -> None:
    config = await server.client.get("/v2/models/tiny/config")
    assert config.status_code == 200, config.text
    assert config.json()["name"] == "tiny" and config.json()["backend"] == "transformers"
    metadata = (await server.client.get("/v2/models/tiny")).json()
    assert metadata["versions"] == ["1"]

    completion = await server.client.post(
        "/v1/completions",
        json={"model": "tiny", "prompt": PROMPT, "max_tokens": 6, "temperature": 0},
    )
    assert completion.status_code == 200, completion.text
    body = completion.json()
    assert body["usage"]["prompt_tokens"] == 4
    text = body["choices"][0]["text"]
    assert text.strip()

    chat = await server.client.post(
        "/v1/chat/completions",
        json={
            "model": "tiny",
            "messages": [{"role": "user", "content": "the fox"}],
            "max_tokens": 4,
            "temperature": 0,
        },
    )
    assert chat.status_code == 200, chat.text
    assert chat.json()["choices"][0]["message"]["role"] == "assistant"

    generated = await server.client.post(
        "/v2/models/tiny/generate",
        json={"text_input": PROMPT, "parameters": {"max_tokens": 6, "temperature": 0}},
    )
    assert generated.status_code == 200, generated.text
    # Greedy: the same tokens as the completion, after the prompt (generate echoes it).
    assert generated.json() == {
        "model_name": "tiny",
        "model_version": "1",
        "text_output": PROMPT + text,
    }


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ("encoder", "config.json names the architectures ['BertModel'], none of them a causal"),
        ("no-weights", "the Hugging Face folder holds no *.safetensors weights"),
    ],
)
async def test_a_folder_that_is_not_a_causal_lm_gets_a_load_error_saying_why(
    server: LlmServer, model: str, reason: str
) -> None:
    response = await server.client.post(f"/v2/repository/models/{model}/load", json={})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error.startswith(f"failed to load '{model}', failed to poll from model repository: ")
    assert reason in error
    index = (await server.client.post("/v2/repository/index", json={})).json()
    assert {"name": model} in index
