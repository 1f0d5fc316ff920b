"""A Hugging Face model folder served as it is: checked as a causal LM, given an engine.

What ``save_pretrained`` writes and ``vllm serve`` takes (``config.json``, ``*.safetensors``,
the tokenizer files) needs no config.pbtxt: :func:`complete_config` checks the folder and
fills in the engine when the registration names none, vLLM where a GPU and vLLM are present
and transformers otherwise (:func:`default_backend`), the way ``vllm serve`` needs only the
folder. The other names of the config (the model's name, version 1) are the load's.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from foundation.proto.model_config_pb2 import ModelConfig
from runtimes.llm.hf import TransformersRuntime
from runtimes.llm.vllm import VllmRuntime

LLM_BACKENDS: Final = (TransformersRuntime.kind, VllmRuntime.kind)
"""The backends that serve a Hugging Face folder."""

_CAUSAL_SUFFIXES: Final = ("ForCausalLM", "LMHeadModel")
"""How transformers names causal-LM heads (``LlamaForCausalLM``, ``GPT2LMHeadModel``): the
rule where transformers, which lists them, is not installed."""


class HfFolderError(ValueError):
    """A Hugging Face folder that cannot be served as an LLM; the message says why."""


def default_backend(gpu_count: int, *, has_vllm: bool) -> str:
    """The engine for a folder whose registration names none."""
    return VllmRuntime.kind if gpu_count > 0 and has_vllm else TransformersRuntime.kind


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def is_causal_lm(architecture: str, known: frozenset[str] = frozenset()) -> bool:
    """Whether ``architecture`` (a ``config.json`` ``architectures`` entry) is a causal LM:
    one of ``known`` (transformers' list) or named as transformers names them."""
    return architecture in known or architecture.endswith(_CAUSAL_SUFFIXES)


def complete_config(folder: Path, config: ModelConfig, *, gpu_count: int) -> None:
    """Check ``folder`` as a causal LM's Hugging Face folder and give ``config`` its engine.

    A ``backend`` the config names must be an LLM engine; a config naming none gets
    :func:`default_backend`'s. Raises HfFolderError saying what is missing or wrong.
    """
    architectures = read_architectures(folder)
    # transformers' list only where the naming rule says no: importing it takes seconds.
    if not any(is_causal_lm(a) for a in architectures) and not any(
        is_causal_lm(a, _known_causal_lms()) for a in architectures
    ):
        raise HfFolderError(
            f"config.json names the architectures {list(architectures)}, none of them a causal "
            "language model (such as LlamaForCausalLM): zeroserve serves Hugging Face folders "
            "as LLMs only"
        )
    if not any(folder.glob("*.safetensors")):
        raise HfFolderError(
            "the Hugging Face folder holds no *.safetensors weights (save_pretrained writes "
            "model.safetensors)"
        )
    if config.platform:
        raise HfFolderError(
            f"a Hugging Face folder is served by an LLM backend ({', '.join(LLM_BACKENDS)}), "
            f"not platform '{config.platform}'"
        )
    if not config.backend:
        config.backend = default_backend(gpu_count, has_vllm=vllm_installed())
    elif config.backend not in LLM_BACKENDS:
        raise HfFolderError(
            f"a Hugging Face folder is served by an LLM backend ({', '.join(LLM_BACKENDS)}), "
            f"not '{config.backend}'"
        )


def read_architectures(folder: Path) -> Sequence[str]:
    """``config.json``'s ``architectures``; raises HfFolderError when it cannot be read."""
    try:
        document = json.loads((folder / "config.json").read_bytes())
    except FileNotFoundError:
        raise HfFolderError("the Hugging Face folder holds no config.json") from None
    except (OSError, ValueError) as exc:
        raise HfFolderError(f"config.json cannot be read: {exc}") from None
    architectures = document.get("architectures") if isinstance(document, dict) else None
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise HfFolderError(
            "config.json has no 'architectures' list, so the model class is unknown "
            "(save_pretrained writes it)"
        )
    return architectures


def _known_causal_lms() -> frozenset[str]:
    """transformers' causal-LM classes, where transformers is installed."""
    if importlib.util.find_spec("transformers") is None:
        return frozenset()
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return frozenset(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
