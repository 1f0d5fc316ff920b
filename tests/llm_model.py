"""The tiny LLM of ``bench.tiny_llm`` (a 2-layer Llama with random weights and a word-level
tokenizer, built on the spot), for tests: its writer skips the calling test when transformers
or torch are missing, and :func:`load_runtime` loads it in the test's process.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from bench import tiny_llm
from bench.tiny_llm import WORDS as WORDS

if TYPE_CHECKING:
    from runtimes.llm.engine_process.client import SpareEngines
    from runtimes.llm.hf import TransformersRuntime


def write_tiny_llm(
    repo: Path,
    name: str,
    *,
    seed: int = 0,
    layers: int = 2,
    hidden: int = 64,
    max_model_len: int = 256,
    parameters: dict[str, str] | None = None,
) -> Path:
    """:func:`bench.tiny_llm.write_tiny_llm`, or skip without transformers and torch."""
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    return tiny_llm.write_tiny_llm(
        repo,
        name,
        seed=seed,
        layers=layers,
        hidden=hidden,
        max_model_len=max_model_len,
        parameters=parameters,
    )


def write_hf_folder(parent: Path, name: str) -> Path:
    """The tiny LLM as a plain Hugging Face folder ``parent/<name>``: what ``save_pretrained``
    wrote (config.json, model.safetensors, the tokenizer files), with no config.pbtxt and no
    version folder. Skips without transformers and torch."""
    staging = parent / f".staging-{name}"
    (write_tiny_llm(staging, name) / "1").rename(parent / name)
    shutil.rmtree(staging)
    return parent / name


def prompt(*words: str) -> str:
    """A prompt of vocabulary words (unknown words would become ``<unk>``)."""
    for word in words:
        assert word in WORDS, word
    return " ".join(words)


async def load_runtime(
    model_dir: Path, *, spares: SpareEngines | None = None, **parameters: str
) -> TransformersRuntime:
    """A :class:`runtimes.llm.hf.TransformersRuntime` loaded from ``model_dir`` on the CPU,
    with config ``parameters`` set, no time to drain on sleep or unload, and ``spares``."""
    from foundation import model_config
    from runtimes.base import RuntimeOptions
    from runtimes.llm.hf import TransformersRuntime
    from runtimes.llm.options import LLMOptions

    config = model_config.read_config_file(model_dir)
    assert config is not None
    for key, value in parameters.items():
        config.parameters[key].string_value = value
    TransformersRuntime.complete_config(model_dir / "1", config)
    runtime = TransformersRuntime(
        name=model_dir.name,
        version=1,
        options=RuntimeOptions(drain_timeout_s=0.0),
        llm_options=LLMOptions(spare_engines=spares),
    )
    await runtime.load(model_dir / "1", config, "cpu")
    return runtime
