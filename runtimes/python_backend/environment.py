"""``EXECUTION_ENV_PATH``: the Python environment a model's stubs run in.

As Triton's: the config parameter names a virtual environment (or conda environment),
unpacked or packed as a ``.tar.gz``; ``$$TRITON_MODEL_DIRECTORY`` in it stands for the
model's folder. Unlike Triton, the environment must lie in the model's folder (after
links are resolved): its ``bin/python`` is code the server runs, and a configuration,
which may come through the load API, must not name code elsewhere on the host. A packed
one is extracted once per file (keyed by its path, size and modification time) under the
temporary folder and reused, as Triton does. The stub then runs on that environment's
``bin/python``, with its ``bin`` first on ``PATH`` and its ``lib`` on ``LD_LIBRARY_PATH``
(what ``source bin/activate`` and Triton's launcher set). The environment needs numpy and
a Python zeroserve's stub runs on (3.11 or newer).

Without the parameter the stub runs on the server's own interpreter.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import tempfile
import uuid
from pathlib import Path
from typing import Final

from foundation.proto import model_config_pb2 as mc
from runtimes.python_backend.process import StubCommand

PARAMETER: Final = "EXECUTION_ENV_PATH"
MODEL_DIRECTORY: Final = "$$TRITON_MODEL_DIRECTORY"
"""Stands for the model's folder in the parameter's value."""


class ExecutionEnvError(Exception):
    """The environment cannot be used; the message is Triton's text where it has one."""


def stub_command(config: mc.ModelConfig, model_dir: Path) -> StubCommand:
    """How to start this model's stubs (blocking: may extract an archive).

    ``model_dir`` is the model's folder (parent of the version folders).
    Raises :class:`ExecutionEnvError` when the parameter names nothing usable.
    """
    if PARAMETER not in config.parameters:
        return StubCommand()
    named = config.parameters[PARAMETER].string_value.replace(MODEL_DIRECTORY, str(model_dir))
    try:
        real = Path(named).resolve(strict=True)
    except (OSError, RuntimeError):
        raise ExecutionEnvError(f"Failed to get the canonical path for {named}.") from None
    folder = model_dir.resolve()
    if not real.is_relative_to(folder):
        raise ExecutionEnvError(
            f"{PARAMETER} {named} resolves to {real}, outside the model's folder {folder}; "
            f"put the environment in the model's folder and name it as {MODEL_DIRECTORY}/..."
        )
    root = real if real.is_dir() else _extracted(real)
    activate = root / "bin" / "activate"
    if not activate.is_file():
        raise ExecutionEnvError(
            f"Path {activate} does not exist. The Python environment should contain an "
            "'activate' script."
        )
    python = next(
        (p for p in (root / "bin" / "python3", root / "bin" / "python") if p.exists()), None
    )
    if python is None:
        raise ExecutionEnvError(f"the Python environment {root} has no bin/python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "VIRTUAL_ENV")}
    env["VIRTUAL_ENV"] = str(root)
    env["PATH"] = os.pathsep.join(filter(None, [str(root / "bin"), env.get("PATH")]))
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        filter(None, [str(root / "lib"), env.get("LD_LIBRARY_PATH")])
    )
    return StubCommand(python=str(python), env=env)


def _extracted(archive: Path) -> Path:
    """The folder ``archive`` (a packed environment) is extracted to, extracting it the
    first time; concurrent loads extract to folders of their own and keep the first."""
    stat = archive.stat()
    key = hashlib.sha256(f"{archive}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()
    base = Path(tempfile.gettempdir()) / "zeroserve-python-envs"
    target = base / key[:24]
    if target.is_dir():
        return target
    base.mkdir(parents=True, exist_ok=True)
    staging = base / f".{key[:24]}-{uuid.uuid4().hex}"
    try:
        with tarfile.open(archive, mode="r:*") as packed:
            # "tar", not "data": an environment's bin/python is often a link to an absolute
            # path (the base interpreter); members still cannot land outside the folder.
            packed.extractall(staging, filter="tar")
    except (OSError, tarfile.TarError) as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise ExecutionEnvError(f"cannot extract the Python environment {archive}: {exc}") from exc
    try:
        staging.rename(target)
    except OSError:
        # Another load extracted the same archive first.
        shutil.rmtree(staging, ignore_errors=True)
    return target
