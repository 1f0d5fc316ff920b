"""Real Triton 2.51 as an oracle: differential tests send the same requests to it and to
zeroserve and compare the answers.

Installing and running Triton is :mod:`bench.triton_server`'s (the benchmarks run it too); this
module adds the Python-backend models the tests give it and the fixtures' skips: where
Triton cannot be installed here, :func:`require_triton` skips the calling test visibly,
saying why.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from bench.server import free_ports
from bench.triton_server import (
    ADD_SUB_MODEL,
    PYTRITON_VERSION,
    TritonInstall,
    TritonServer,
    cache_dir,
    run_triton,
    triton_install,
)
from foundation.proto import model_config_pb2 as mc
from tests.integration.conftest import START_TIMEOUT_S, ServerProcess, free_port, start_server
from tests.models import write_config

__all__ = [
    "ADD_SUB_MODEL",
    "IDENTITY_MODEL",
    "PYTRITON_VERSION",
    "ServerPair",
    "TritonInstall",
    "TritonServer",
    "cache_dir",
    "explicit_pair",
    "free_ports",
    "require_triton",
    "run_triton",
    "triton_for",
    "triton_install",
    "triton_refusal",
    "write_python_backend_model",
]


IDENTITY_MODEL = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses
"""
"""A Python-backend ``model.py`` in Triton's form: ``OUTPUT0 = INPUT0``."""


def write_python_backend_model(
    repo: Path, config: mc.ModelConfig, source: str, *, version: int = 1
) -> Path:
    """``repo/<config.name>`` for Triton's Python backend: ``config`` with its backend set to
    ``python`` and ``source`` (a ``model.py`` in Triton's form) as version ``version``."""
    model_dir = repo / config.name
    python_config = mc.ModelConfig()
    python_config.CopyFrom(config)
    python_config.platform = ""
    python_config.backend = "python"
    write_config(model_dir, python_config)
    (model_dir / str(version)).mkdir(parents=True, exist_ok=True)
    (model_dir / str(version) / "model.py").write_text(source)
    return model_dir


def require_triton() -> TritonInstall:
    """The install, or a visible skip of the calling test (or fixture) saying why not."""
    install = triton_install()
    if isinstance(install, str):
        pytest.skip(f"real Triton {PYTRITON_VERSION} unavailable: {install}")
    return install


@contextlib.contextmanager
def triton_for(repository: Path, log_dir: Path, *args: str) -> Iterator[TritonServer]:
    """:func:`run_triton` with the install from :func:`require_triton` (skipping without
    it): what a fixture yields."""
    with run_triton(require_triton(), repository, log_dir, *args) as server:
        yield server


REFUSAL_WAIT_S = 90.0
"""How long a Triton of its own gets to answer the load of a model it refuses."""


def triton_refusal(repository: Path, log_dir: Path, model: str) -> httpx.Response:
    """Triton's answer to loading ``model`` from ``repository``, asked of a Triton of its
    own (explicit model control, nothing else loaded) that is stopped afterwards.

    Triton 2.51's Python backend can wait forever on a stub whose model it then refuses
    (fixed after 2.51: triton-inference-server/python_backend PR #408); such a load hung a
    shared oracle in CI and every later test on it failed. A Triton of its own keeps that
    away from other tests; a hang is retried once on a fresh Triton, then skips visibly
    with the log's tail, since the oracle had no answer to give."""
    tails: list[str] = []
    for _attempt in range(2):
        with triton_for(repository, log_dir, "--model-control-mode=explicit") as triton:
            try:
                return httpx.post(
                    f"{triton.http_url}/v2/repository/models/{model}/load",
                    timeout=REFUSAL_WAIT_S,
                )
            except httpx.TimeoutException:
                tails.append(triton.log()[-1500:])
    pytest.skip(
        f"Triton {PYTRITON_VERSION} did not answer the load of '{model}' within "
        f"{REFUSAL_WAIT_S:.0f} s, twice (python_backend PR #408); its log ends:\n{tails[-1]}"
    )


@dataclass(frozen=True)
class ServerPair:
    """Real Triton and ``zeroserve serve`` on the same repository."""

    triton: TritonServer
    zeroserve: ServerProcess
    zeroserve_grpc: str
    """zeroserve's gRPC address (host:port)."""

    def http(self) -> list[str]:
        """Both HTTP base URLs, Triton's first."""
        return [self.triton.http_url, self.zeroserve.url]

    def grpc(self) -> list[str]:
        """Both gRPC addresses, Triton's first."""
        return [self.triton.grpc_address, self.zeroserve_grpc]


@contextlib.contextmanager
def explicit_pair(
    repository: Path,
    tmp_path_factory: pytest.TempPathFactory,
    models: Sequence[str],
    *triton_args: str,
) -> Iterator[ServerPair]:
    """Triton (with ``triton_args`` besides) and zeroserve (with a gRPC port) serving
    ``repository`` in explicit model control, ``models`` loaded at start and ready on
    both; both stopped when the block ends. Skips without Triton, as :func:`triton_for`."""
    loads = [f"--load-model={name}" for name in models]
    with triton_for(
        repository,
        tmp_path_factory.mktemp("triton-log"),
        "--model-control-mode=explicit",
        *triton_args,
        *loads,
    ) as triton:
        grpc_port = free_port()
        zeroserve = start_server(
            repository,
            tmp_path_factory.mktemp("zeroserve-log"),
            "--grpc-port",
            str(grpc_port),
            "--model-control-mode=explicit",
            *loads,
        )
        try:
            with httpx.Client(base_url=zeroserve.url, timeout=START_TIMEOUT_S) as client:
                for model in models:
                    assert client.get(f"/v2/models/{model}/ready").status_code == 200, model
            yield ServerPair(triton, zeroserve, f"127.0.0.1:{grpc_port}")
        finally:
            zeroserve.stop()
