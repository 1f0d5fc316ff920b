"""A tiny LLM built on the spot (never downloaded): a Llama with random weights and a
word-level tokenizer, in Triton's repository layout, for the LLM benchmark and the tests.

``write_tiny_llm(repo, name)`` writes ``repo/<name>/config.pbtxt`` (``backend:
"transformers"``) and ``repo/<name>/1/`` (``config.json``, ``model.safetensors``, the
tokenizer files and a chat template) and returns ``repo/<name>``. Every token decodes to one
word of :data:`WORDS`, so texts are readable and a stop string can be a word. It needs the
``llm`` and ``torch`` extras (transformers, tokenizers, torch).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

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
    """The model folder ``repo/<name>`` (created); see the module docstring. Raises
    ``ImportError`` without transformers, tokenizers or torch."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {token: index for index, token in enumerate((*SPECIAL, *WORDS))}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # transformers leaves this constructor unannotated.
    fast = transformers.PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
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
