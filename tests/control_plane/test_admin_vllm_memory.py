"""A vLLM model on a GPU registers only with a memory figure: the placer shares GPUs by it
and vLLM's share of the GPU is derived from it."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from control_plane.worker_client import load_body
from foundation.records import ModelRecord, ResourceSpec
from tests.control_plane.test_api import Api, api, error_of

pytestmark = pytest.mark.anyio

__all__ = ["api"]  # the fixture, imported to be used here

_CUDA_UNKNOWN = {"device": "cuda", "memory_bytes": 0}


@pytest.mark.parametrize(
    "fields",
    [
        {"backend": "vllm", "resources": _CUDA_UNKNOWN},
        {"config": {"backend": "vllm"}, "resources": {"device": "cuda"}},
    ],
    ids=["backend", "config-backend"],
)
async def test_vllm_on_a_gpu_without_memory_bytes_is_422(api: Api, fields: dict[str, Any]):
    response = await api.register("llm", **fields)
    assert response.status_code == 422, response.text
    assert "resources.memory_bytes" in error_of(response)


@pytest.mark.parametrize(
    "fields",
    [
        {"backend": "vllm", "resources": {"device": "cuda", "memory_bytes": 8 * 2**30}},
        {"backend": "onnxruntime", "resources": _CUDA_UNKNOWN},
    ],
    ids=["vllm-with-memory", "not-vllm"],
)
async def test_others_register(api: Api, fields: dict[str, Any]):
    response = await api.register("m", **fields)
    assert response.status_code == 201, response.text


def test_the_load_carries_the_memory_figure_to_the_runtime():
    model = ModelRecord(
        name="llm",
        storage_uri="/models/llm",
        backend="vllm",
        config={"parameters": {"max_num_seqs": {"string_value": "8"}}},
        resources=ResourceSpec(device="cuda", memory_bytes=8 * 2**30),
    )
    config = json.loads(load_body(model)["parameters"]["config"])
    assert config["parameters"] == {
        "max_num_seqs": {"string_value": "8"},
        "memory_bytes": {"string_value": str(8 * 2**30)},
    }
    config_sets_it = {"parameters": {"memory_bytes": {"string_value": "5"}}}
    own = dataclasses.replace(model, config=config_sets_it)
    assert json.loads(load_body(own)["parameters"]["config"])["parameters"] == {
        "memory_bytes": {"string_value": "5"}
    }
