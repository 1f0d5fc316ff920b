"""What kind of model folder a listing shows: Triton's layout or a Hugging Face folder.

A Triton model folder holds numeric version folders (``1/model.onnx``) and usually a
``config.pbtxt``. A Hugging Face folder is what ``save_pretrained`` writes and ``vllm serve``
takes: ``config.json``, ``*.safetensors`` and the tokenizer files, with no version folder.
The node cache presents the second as the first, its files as version 1 (:data:`HF_VERSION`),
so that everything after the fetch sees one layout; the load plan then knows, from
:attr:`CachedModel.layout <data_plane.storage.CachedModel>`, to read the folder as an LLM.

:func:`detect_layout` is pure (folder-relative paths in, the kind out), so that a local
folder and an S3 listing are judged by one rule.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable
from typing import Final

from data_plane.storage.errors import StorageNotFoundError
from data_plane.storage.s3 import Listing
from foundation.model_config import is_version

HF_CONFIG: Final = "config.json"
"""The file at the top of a folder that makes it a Hugging Face model folder."""

HF_VERSION: Final = "1"
"""The version a Hugging Face folder is served as."""


class ModelLayout(enum.Enum):
    """How a model folder is laid out."""

    TRITON = "triton"
    """Numeric version folders (and a ``config.pbtxt``, or the registration's config)."""
    HUGGING_FACE = "hugging_face"
    """A Hugging Face model folder, served as version :data:`HF_VERSION` of an LLM."""


def detect_layout(relatives: Iterable[str]) -> ModelLayout | None:
    """The layout of a folder whose entries are ``relatives`` (``/``-separated paths from
    the folder: files, and folders ending in ``/``); None when it holds no model.

    A numeric version folder holding something, or itself listed (an ensemble's version
    folder is empty), makes the folder Triton's: a Triton folder keeps working as it did,
    whatever else it holds. Otherwise a ``config.json`` at the top makes it Hugging Face's.
    """
    has_hf_config = False
    for relative in relatives:
        head, slash, _rest = relative.partition("/")
        if slash and is_version(head):
            return ModelLayout.TRITON
        has_hf_config = has_hf_config or relative == HF_CONFIG
    return ModelLayout.HUGGING_FACE if has_hf_config else None


def check_model_layout(relatives: Iterable[str], *, uri: str) -> ModelLayout:
    """:func:`detect_layout`, refusing a folder that holds no model."""
    layout = detect_layout(relatives)
    if layout is None:
        raise StorageNotFoundError(
            uri=uri,
            reason="no model here: expected a Triton model folder (config.pbtxt and numeric "
            "version folders such as 1/model.onnx), a Hugging Face model folder (config.json, "
            "*.safetensors and the tokenizer files) or a single model file",
        )
    return layout


def as_version_one(listing: Listing) -> Listing:
    """A Hugging Face folder's objects placed as version :data:`HF_VERSION` of a Triton
    folder."""
    return dataclasses.replace(
        listing,
        objects=tuple(
            dataclasses.replace(o, relative=f"{HF_VERSION}/{o.relative}") for o in listing.objects
        ),
    )
