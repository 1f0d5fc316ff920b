"""Which contract a ``model.py`` follows, read from its source without running it.

A model follows Triton's Python-backend contract (``execute(self, requests)`` returning
``pb_utils.InferenceResponse`` objects; it runs in stub processes) when any of these holds:

* it imports ``triton_python_backend_utils`` (``import triton_python_backend_utils as
  pb_utils``, as Triton's documentation writes every model);
* ``TritonPythonModel.execute`` names its argument ``requests``;
* its configuration sets ``EXECUTION_ENV_PATH`` (only a stub can run another Python);
* the file does not parse: the stub reports the syntax error in Triton's words.

Otherwise it follows zeroserve's dict contract (``execute(self, inputs)`` taking and
returning a dict of arrays for one merged batch), which runs in the server's process:
the fast path for trusted code, without a process boundary.

The source is parsed, never imported, so that deciding costs no model code in the server.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Final

from foundation.proto import model_config_pb2 as mc
from runtimes.python_backend import environment

UTILS_MODULE: Final = "triton_python_backend_utils"
MODEL_CLASS: Final = "TritonPythonModel"


def follows_triton_contract(path: Path, config: mc.ModelConfig) -> bool:
    """Whether ``path`` (a ``model.py`` that exists) is a Triton Python-backend model."""
    if environment.PARAMETER in config.parameters:
        return True
    tree = _parse(path)
    if tree is None:
        return True
    if any(_imports_utils(node) for node in ast.walk(tree)):
        return True
    execute = _method(tree, "execute")
    if execute is None:
        return False
    names = [a.arg for a in execute.args.posonlyargs + execute.args.args]
    return len(names) >= 2 and names[1] == "requests"


def defines_auto_complete(path: Path) -> bool:
    """Whether ``TritonPythonModel`` in ``path`` defines ``auto_complete_config``."""
    tree = _parse(path)
    return tree is not None and _method(tree, "auto_complete_config") is not None


def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError):
        return None


def _imports_utils(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        return any(alias.name.split(".")[0] == UTILS_MODULE for alias in node.names)
    if isinstance(node, ast.ImportFrom):
        return (node.module or "").split(".")[0] == UTILS_MODULE
    return False


def _method(tree: ast.Module, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == MODEL_CLASS:
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name == name:
                    return item
    return None
