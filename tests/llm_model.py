"""A tiny LLM built on the spot (never downloaded): a 2-layer Llama with random weights and a
word-level tokenizer, in Triton's repository layout.

``write_tiny_llm(repo, name)`` writes ``repo/<name>/config.pbtxt`` (``backend:
"transformers"``) and ``repo/<name>/1/`` (``config.json``, ``model.safetensors``, the
tokenizer files and a chat template) and returns ``repo/<name>``. Every token decodes to one
word of :data:`WORDS`, so texts are readable and a stop string can be a word. Skips the
calling test when transformers or torch are missing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Final

import pytest

if TYPE_CHECKING:
    from runtimes.llm.engine_process.client import SpareEngines
    from runtimes.llm.hf import TransformersRuntime

SPECIAL: Final = ("<s>", "</s>", "<unk>")
WORDS: Final = tuple(
    f"{stem}{suffix}"
    for suffix in ("", "s", "ed", "ing", "er", "ly")
    for stem in (
        "the fox dog cat bird tree river stone cloud light dark road house field door "
        "window bread water fire wind snow rain sun moon star sea hill song word book "
        "hand eye heart mind time day night year king queen child horse ship wall gate "
        "bell path"
    ).split()
)
"""The vocabulary after the special tokens: 50 stems in 6 forms (300 words)."""

CHAT_TEMPLATE: Final = (
    "<s>{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant{% endif %}"
)
"""Roles and contents as words (``system``/``user``/``assistant`` are not in the vocabulary
and become ``<unk>``, which is fine for a model with random weights)."""


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
    """The model folder ``repo/<name>`` (created); see the module docstring."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {token: index for index, token in enumerate((*SPECIAL, *WORDS))}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.chat_template = CHAT_TEMPLATE
    config = transformers.LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_model_len,
        bos_token_id=0,
        eos_token_id=1,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config)
    model_dir = repo / name
    version_dir = model_dir / "1"
    version_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(version_dir)
    fast.save_pretrained(version_dir)
    lines = [f'name: "{name}"', 'backend: "transformers"']
    for key, value in (parameters or {}).items():
        lines.append(f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}')
    (model_dir / "config.pbtxt").write_text("\n".join(lines) + "\n")
    return model_dir


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
