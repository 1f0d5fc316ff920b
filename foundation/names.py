"""The one rule for model names, shared by every component.

A name is a folder in a Triton model repository and in the node cache, a path segment of
every ``/v2/models/{name}`` URL, a label value in the metrics and a key in the state store,
so it is held to what is safe in all of them: ASCII letters, digits, ``_``, ``-`` and ``.``
(Triton's repositories use the same characters), not starting with ``.`` or ``-`` (hidden
folders, command-line options), and at most :data:`MODEL_NAME_MAX_LENGTH` characters, which
leaves room under the file system's 255-byte limit for the cache's lock and temporary names.
The admin API refuses other names at registration; the data plane refuses to fetch them.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["MODEL_NAME_MAX_LENGTH", "MODEL_NAME_RULE", "model_name_problem"]

MODEL_NAME_MAX_LENGTH: Final = 200

MODEL_NAME_RULE: Final = (
    "use ASCII letters, digits, '_', '-' and '.', not starting with '.' or '-', "
    f"at most {MODEL_NAME_MAX_LENGTH} characters"
)
"""The rule in words, for error messages."""

_MODEL_NAME: Final = re.compile(rf"[A-Za-z0-9_][A-Za-z0-9_.\-]{{0,{MODEL_NAME_MAX_LENGTH - 1}}}")


def model_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a model, or None when it can."""
    # fullmatch, not match with "$": "$" also matches before a trailing newline.
    if _MODEL_NAME.fullmatch(name) is None:
        return f"model name {name!r} is not allowed: {MODEL_NAME_RULE}"
    return None
