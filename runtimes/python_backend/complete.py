"""Triton's auto-complete for Python models: ``TritonPythonModel.auto_complete_config``.

Runs in a stub of its own that exits once it answered (as in Triton, nothing it builds
survives into ``initialize``), and only for models whose class defines the method, so
that other models start no extra process. The model gets the configuration as Triton's
JSON in a ``pb_utils.ModelConfig`` and what it returns becomes the configuration;
``backend`` and ``platform`` stay what the server chose the runtime by.
"""

from __future__ import annotations

import json
from pathlib import Path

from foundation import model_config
from foundation.proto import model_config_pb2 as mc
from runtimes.errors import ModelLoadError
from runtimes.python_backend import environment, messages, process
from runtimes.python_backend.contract import defines_auto_complete
from runtimes.python_backend.limits import limits_for


def auto_complete(path: Path, config: mc.ModelConfig, *, model: str) -> None:
    """Complete ``config`` in place with the ``auto_complete_config`` of ``path`` (a
    ``model.py`` in a version folder); nothing when the class defines none (blocking).

    Raises :class:`ModelLoadError` for ``model`` with the model's error text.
    """
    if not path.is_file() or not defines_auto_complete(path):
        return
    try:
        limits = limits_for(config)
        command = environment.stub_command(config, path.parent.parent)
        started = process.start(f"{model}_auto_complete", command, limits)
    except (ValueError, environment.ExecutionEnvError, process.StubError) as exc:
        raise ModelLoadError(model=model, reason=str(exc)) from exc
    try:
        started.sock.settimeout(limits.load_timeout_s)
        messages.send(
            started.sock,
            {
                "kind": "auto_complete",
                "path": str(path),
                "version": path.parent.name,
                "model": model,
                "name": model,
                "config": json.dumps(model_config.to_json(config)),
            },
        )
        reply = messages.receive(started.sock)
    except (OSError, messages.ChannelClosedError, ValueError) as exc:
        raise ModelLoadError(
            model=model, reason=f"auto-complete in the Python stub failed: {exc!r}"
        ) from exc
    finally:
        started.kill()
    error = reply.get("error")
    if error is not None:
        raise ModelLoadError(model=model, reason=str(error))
    try:
        completed = model_config.parse_json(reply["config"])
    except (model_config.ConfigError, KeyError) as exc:
        raise ModelLoadError(
            model=model,
            reason=f"auto_complete_config returned a configuration that is not valid: {exc}",
        ) from exc
    completed.backend, completed.platform = config.backend, config.platform
    config.CopyFrom(completed)
