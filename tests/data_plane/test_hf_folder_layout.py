"""The rules that make a folder a Hugging Face LLM, as tables: the layout a listing shows,
which architectures are causal LMs, which engine a folder gets, and the config it is given."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from data_plane.storage import ModelLayout, StorageNotFoundError
from data_plane.storage.layout import as_version_one, check_model_layout, detect_layout
from data_plane.storage.s3 import Listing, RemoteObject
from foundation.proto.model_config_pb2 import ModelConfig
from runtimes.llm import hf_folder

HF_FILES = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]


@pytest.mark.parametrize(
    ("relatives", "expected"),
    [
        pytest.param(["config.pbtxt", "1/model.onnx"], ModelLayout.TRITON, id="triton"),
        pytest.param(["1/model.onnx"], ModelLayout.TRITON, id="triton-without-config"),
        pytest.param(["config.pbtxt", "1/"], ModelLayout.TRITON, id="ensemble-empty-version"),
        pytest.param(["3/model.py", "10/model.py"], ModelLayout.TRITON, id="many-versions"),
        pytest.param(
            ["config.pbtxt", "1/config.json", "1/model.safetensors"],
            ModelLayout.TRITON,
            id="llm-in-triton-layout",
        ),
        pytest.param(
            ["config.json", "1/model.onnx"], ModelLayout.TRITON, id="a-version-folder-wins"
        ),
        pytest.param(HF_FILES, ModelLayout.HUGGING_FACE, id="hugging-face"),
        pytest.param(
            ["config.json", "model-00001-of-00002.safetensors", "original/params.json"],
            ModelLayout.HUGGING_FACE,
            id="hugging-face-with-subfolder",
        ),
        pytest.param(["config.json"], ModelLayout.HUGGING_FACE, id="config-json-only"),
        pytest.param(["config.pbtxt"], None, id="config-pbtxt-only"),
        pytest.param(["sub/config.json", "model.safetensors"], None, id="config-json-not-on-top"),
        pytest.param(["v1/model.onnx", "01x/model.onnx"], None, id="not-numeric"),
        pytest.param(["1"], None, id="a-file-named-1"),
        pytest.param([], None, id="empty"),
    ],
)
def test_detect_layout(relatives: list[str], expected: ModelLayout | None) -> None:
    assert detect_layout(relatives) is expected


def test_a_folder_without_a_model_is_refused_naming_both_layouts() -> None:
    with pytest.raises(StorageNotFoundError) as caught:
        check_model_layout(["README.md"], uri="s3://b/m")
    assert "Triton model folder" in caught.value.message
    assert "Hugging Face model folder (config.json" in caught.value.message


def test_a_hugging_face_listing_is_placed_as_version_one() -> None:
    listing = Listing(
        (RemoteObject("m/config.json", "config.json", 10, "e1"),
         RemoteObject("m/sub/a.bin", "sub/a.bin", 3, "e2")),
        is_single_file=False,
    )  # fmt: skip
    placed = as_version_one(listing)
    assert [(o.key, o.relative) for o in placed.objects] == [
        ("m/config.json", "1/config.json"),
        ("m/sub/a.bin", "1/sub/a.bin"),
    ]
    assert detect_layout(o.relative for o in placed.objects) is ModelLayout.TRITON


@pytest.mark.parametrize(
    ("architecture", "known", "expected"),
    [
        ("LlamaForCausalLM", frozenset(), True),
        ("GPT2LMHeadModel", frozenset(), True),
        ("Gemma3ForConditionalGeneration", frozenset({"Gemma3ForConditionalGeneration"}), True),
        ("BertModel", frozenset(), False),
        ("BertForSequenceClassification", frozenset({"LlamaForCausalLM"}), False),
        ("T5ForConditionalGeneration", frozenset(), False),
    ],
)
def test_is_causal_lm(architecture: str, known: frozenset[str], expected: bool) -> None:
    assert hf_folder.is_causal_lm(architecture, known) is expected


@pytest.mark.parametrize(
    ("gpu_count", "has_vllm", "expected"),
    [(0, False, "transformers"), (0, True, "transformers"), (1, False, "transformers"),
     (1, True, "vllm"), (4, True, "vllm")],
)  # fmt: skip
def test_default_backend(gpu_count: int, has_vllm: bool, expected: str) -> None:
    assert hf_folder.default_backend(gpu_count, has_vllm=has_vllm) == expected


def _folder(tmp_path: Path, config: object, *, weights: bool = True) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    if weights:
        (tmp_path / "model.safetensors").write_bytes(b"")
    return tmp_path


LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}


@pytest.mark.parametrize(
    ("backend", "expected"),
    [("", "transformers"), ("transformers", "transformers"), ("vllm", "vllm")],
)
def test_complete_config_keeps_the_named_llm_backend_or_gives_the_default(
    tmp_path: Path, backend: str, expected: str
) -> None:
    config = ModelConfig(backend=backend)
    hf_folder.complete_config(_folder(tmp_path, LLAMA), config, gpu_count=0)
    assert config.backend == expected


@pytest.mark.parametrize(
    ("config_json", "weights", "model_config", "message"),
    [
        pytest.param(
            {"architectures": ["BertModel"]}, True, ModelConfig(), "none of them a causal",
            id="not-causal",
        ),
        pytest.param(LLAMA, False, ModelConfig(), "no *.safetensors weights", id="no-weights"),
        pytest.param({"model_type": "llama"}, True, ModelConfig(), "no 'architectures'",
                     id="no-architectures"),
        pytest.param(["not", "an", "object"], True, ModelConfig(), "no 'architectures'",
                     id="not-an-object"),
        pytest.param(LLAMA, True, ModelConfig(backend="onnxruntime"), "not 'onnxruntime'",
                     id="not-an-llm-backend"),
        pytest.param(LLAMA, True, ModelConfig(platform="onnxruntime_onnx"), "not platform",
                     id="a-platform"),
    ],
)  # fmt: skip
def test_complete_config_refuses_what_cannot_be_served(
    tmp_path: Path, config_json: object, weights: bool, model_config: ModelConfig, message: str
) -> None:
    with pytest.raises(hf_folder.HfFolderError, match=message.replace("*", r"\*")):
        hf_folder.complete_config(
            _folder(tmp_path, config_json, weights=weights), model_config, gpu_count=0
        )


def test_unreadable_config_json_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{nope")
    with pytest.raises(hf_folder.HfFolderError, match="config.json cannot be read"):
        hf_folder.complete_config(tmp_path, ModelConfig(), gpu_count=0)


def test_a_causal_lm_named_otherwise_is_found_in_transformers_list(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    config = ModelConfig()
    folder = _folder(tmp_path, {"architectures": ["Gemma3ForConditionalGeneration"]})
    hf_folder.complete_config(folder, config, gpu_count=0)
    assert config.backend == "transformers"
