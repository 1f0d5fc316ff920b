"""Which pool a model goes to: the model's backend and device against the configured pools."""

from __future__ import annotations

import pytest

from control_plane.placement.routing import model_backend, pool_for
from control_plane.settings import PoolSettings
from foundation.records import ModelRecord

GPU = PoolSettings(name="gpu", device="cuda")
VLLM = PoolSettings(name="vllm", backends=("vllm",), device="cuda")
VLLM_CPU = PoolSettings(name="vllm-cpu", backends=("vllm",), device="cpu")
LLM = PoolSettings(name="llm", backends=("vllm", "transformers"), device="cuda")


@pytest.mark.parametrize(
    ("backend", "device", "pools", "expected"),
    [
        pytest.param("vllm", "cuda", (GPU, VLLM), "vllm", id="vllm-to-its-pool"),
        pytest.param("onnxruntime", "cuda", (GPU, VLLM), "gpu", id="onnx-to-default"),
        pytest.param("", "cuda", (GPU, VLLM), "gpu", id="no-backend-to-default"),
        pytest.param("vllm", "cuda", (GPU,), "gpu", id="one-pool-takes-all"),
        pytest.param("transformers", "cpu", (GPU, VLLM, LLM), "llm", id="second-backend"),
        pytest.param("vllm", "cpu", (GPU, VLLM, VLLM_CPU), "vllm-cpu", id="device-decides"),
        pytest.param("vllm", "cuda", (GPU, VLLM_CPU, VLLM), "vllm", id="device-over-order"),
        pytest.param("vllm", "cpu", (GPU, VLLM), "vllm", id="cuda-pool-runs-cpu"),
        # Refused there for its device, by name, rather than failing in an image without vLLM.
        pytest.param("vllm", "cuda", (GPU, VLLM_CPU), "vllm-cpu", id="no-device-match"),
        pytest.param("VLLM", "cuda", (GPU, VLLM), "gpu", id="names-are-exact"),
    ],
)
def test_pool_for(
    backend: str, device: str, pools: tuple[PoolSettings, ...], expected: str
) -> None:
    assert pool_for(backend, device, pools, default="gpu") == expected


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        pytest.param(ModelRecord("m", "/m", backend="vllm"), "vllm", id="field"),
        pytest.param(ModelRecord("m", "/m", config={"backend": "vllm"}), "vllm", id="config"),
        pytest.param(
            ModelRecord("m", "/m", backend="onnxruntime", config={"backend": "vllm"}),
            "onnxruntime",
            id="field-first",
        ),
        pytest.param(ModelRecord("m", "/m", platform="onnxruntime_onnx"), "", id="platform"),
        pytest.param(ModelRecord("m", "/m", config={"backend": 3}), "", id="not-a-name"),
    ],
)
def test_model_backend(record: ModelRecord, expected: str) -> None:
    assert model_backend(record) == expected
