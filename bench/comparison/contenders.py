"""The servers under comparison, each started as its own process tree on loopback ports.

Every contender serves the same generated models over the Open Inference Protocol (V2) on
``url``, can be stopped however the run ends, and loads and unloads a model through its own
API (the V2 repository extension, or zeroserve's admin API through the platform), returning
only once the model is ready. Each one's model files are hard links to the same generated
``.onnx`` files, so all of them read the same bytes from the same page cache.
"""

from __future__ import annotations

import abc
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from bench.platform_process import PlatformProcess
from bench.server import HOST, ServerProcess, free_port, request, server_command

PEERS_SOURCE: Final = Path(__file__).resolve().parents[1] / "peers"
LOAD_TIMEOUT_S: Final = 600.0
"""A 1 GB model can take a while to load on two busy cores."""


class ContenderError(RuntimeError):
    """A server did not start, or refused to load or unload."""


class Contender(abc.ABC):
    """One server under test: start, stop, where it answers, and model load/unload."""

    key: str
    """Short name used in results (``zeroserve``, ``mlserver``...)."""
    title: str
    """What it is, for tables."""
    protocols: tuple[str, ...] = ("json",)
    """What it is measured over: ``json`` and ``binary`` (HTTP/1.1), ``grpc``."""

    @property
    def grpc_address(self) -> str | None:
        """host:port of its gRPC endpoint; None where it is not measured over gRPC."""
        return None

    @property
    @abc.abstractmethod
    def url(self) -> str:
        """Base URL of its V2 endpoint."""

    @property
    @abc.abstractmethod
    def pid(self) -> int:
        """The root of its process tree (its CPU is the tree's)."""

    @property
    @abc.abstractmethod
    def command(self) -> list[str]:
        """How it was started, for the results."""

    @abc.abstractmethod
    def start(self) -> None:
        """Start and wait until ready with its initial models loaded."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop it and everything it started; safe to call twice."""

    @abc.abstractmethod
    def load(self, model: str) -> None:
        """Load ``model``; returns once it is ready to serve."""

    @abc.abstractmethod
    def unload(self, model: str) -> None:
        """Unload ``model``; returns once the server says it is gone."""


def link_model(source: Path, target: Path) -> None:
    """``target`` as a hard link to ``source`` (a copy across file systems)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        target.unlink()
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def _env_prefix(env: dict[str, str]) -> list[str]:
    # `env` execs the program, so the pid ServerProcess sees is the server's own.
    return ["env", *(f"{k}={v}" for k, v in env.items())] if env else []


def repository_call(port: int, key: str, model: str, action: str, *, log_tail: str = "") -> None:
    """``POST /v2/repository/models/{model}/{action}`` (``load`` or ``unload``) on the server
    ``key`` at ``port``; raises :class:`ContenderError` (with ``log_tail``) unless it answers
    200, which it does once the model is ready or gone."""
    status, _, body = request(
        port,
        "POST",
        f"/v2/repository/models/{model}/{action}",
        body=b"{}",
        headers={"Content-Type": "application/json"},
        timeout_s=LOAD_TIMEOUT_S,
    )
    if status != 200:
        raise ContenderError(
            f"{key}: {action} {model} answered {status}: {body[:300]!r}\n{log_tail}"
        )


class _V2RepositoryServer(Contender):
    """A server loading and unloading through ``/v2/repository/models/{name}/{load,unload}``."""

    def __init__(self, command: list[str], port: int, log_path: Path) -> None:
        self._port = port
        self._server = ServerProcess(command, port, log_path, start_timeout_s=300.0)
        self._initial: tuple[str, ...] = ()

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self._port}"

    @property
    def pid(self) -> int:
        return self._server.pid

    @property
    def command(self) -> list[str]:
        return list(self._server.command)

    def start(self) -> None:
        self._server.__enter__()
        try:
            for model in self._initial:
                self.load(model)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        self._server.stop()

    def load(self, model: str) -> None:
        self._repository_call(model, "load")

    def unload(self, model: str) -> None:
        self._repository_call(model, "unload")

    def _repository_call(self, model: str, action: str) -> None:
        repository_call(self._port, self.key, model, action, log_tail=self._server.log_tail())


class ZeroserveDirect(_V2RepositoryServer):
    """``python -m data_plane`` (what ``zeroserve serve`` runs) in explicit mode."""

    key = "zeroserve"
    title = "zeroserve data plane, direct"
    protocols = ("json", "binary", "grpc")

    def __init__(
        self,
        workdir: Path,
        repository: Path,
        initial: Sequence[str],
        *,
        log_name: str = "zeroserve.log",
    ) -> None:
        port = free_port()
        self._grpc_port = free_port()
        env = {"ZEROSERVE_CACHE_DIR": str(workdir / "zeroserve-cache")}
        command = _env_prefix(env) + server_command(repository, port, list(initial))
        command += ["--grpc-port", str(self._grpc_port)]
        super().__init__(command, port, workdir / log_name)

    @property
    def grpc_address(self) -> str | None:
        return f"{HOST}:{self._grpc_port}"


class ZeroserveActivator(Contender):
    """``zeroserve up``: requests go through the activator to a local worker."""

    key = "zeroserve-activator"
    title = "zeroserve through the activator"

    def __init__(self, workdir: Path, repository: Path, initial: Sequence[str]) -> None:
        self._repository = repository
        self._initial = tuple(initial)
        self._registered: set[str] = set()
        self._platform = PlatformProcess(
            workdir,
            cache_dir=workdir / "platform-cache",
            allowed_storage=(str(repository),),
            max_workers=2,
            name="zeroserve-activator",
        )

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self._platform.port}"

    @property
    def pid(self) -> int:
        return self._platform.pid

    @property
    def command(self) -> list[str]:
        return list(self._platform.command)

    def start(self) -> None:
        self._platform.__enter__()
        try:
            for model in self._initial:
                # One replica held for the whole run: the steady-state path, not cold starts.
                self._register(model, {"min_replicas": 1, "max_replicas": 1})
                self._platform.load(model)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        self._platform.stop()

    def load(self, model: str) -> None:
        self._register(model, {"min_replicas": 0, "max_replicas": 1})
        self._platform.load(model)

    def unload(self, model: str) -> None:
        self._platform.unload(model)

    def _register(self, model: str, scaling: dict[str, int]) -> None:
        if model not in self._registered:
            self._platform.register(model, str(self._repository / model), scaling)
            self._registered.add(model)


class Mlserver(_V2RepositoryServer):
    """MLServer 1.7.1 with the custom ONNX Runtime runtime and adaptive batching.

    ``metadata`` holds each model's ``inputs`` and ``outputs`` (V2 metadata) for its
    model-settings.json. ``parallel_workers`` None keeps MLServer's default (one inference
    worker process); 0 runs inference in the server process, which the issue found to be its
    best setting.
    Access logs are off (``debug: false``); models load through the repository API.
    """

    def __init__(
        self,
        workdir: Path,
        python: Path,
        models: dict[str, Path],
        metadata: dict[str, dict[str, list[dict[str, object]]]],
        initial: Sequence[str],
        *,
        parallel_workers: int | None,
        max_batch_size: int,
        max_batch_time_s: float,
        env: dict[str, str],
    ) -> None:
        self.key = "mlserver" if parallel_workers == 0 else "mlserver-default"
        workers = "default (1)" if parallel_workers is None else str(parallel_workers)
        self.title = f"MLServer 1.7.1, adaptive batching, parallel_workers={workers}"
        port = free_port()
        root = workdir / self.key
        root.mkdir(parents=True, exist_ok=True)
        for name in ("ort_session.py", "mlserver_ort.py"):
            shutil.copyfile(PEERS_SOURCE / name, root / name)
        settings: dict[str, object] = {
            "debug": False,
            "host": HOST,
            "http_port": port,
            "grpc_port": free_port(),
            "metrics_port": free_port(),
            "metrics_dir": str(root / "metrics"),
            "load_models_at_startup": False,
        }
        if parallel_workers is not None:
            settings["parallel_workers"] = parallel_workers
        (root / "settings.json").write_text(json.dumps(settings, indent=2), encoding="utf-8")
        for name, onnx_path in models.items():
            folder = root / "models" / name
            link_model(onnx_path, folder / "model.onnx")
            model_settings = {
                "name": name,
                "implementation": "mlserver_ort.OnnxRuntimeModel",
                "max_batch_size": max_batch_size,
                "max_batch_time": max_batch_time_s,
                "parameters": {"uri": "./model.onnx"},
                # MLServer's model metadata comes from here, as its docs show.
                **metadata[name],
            }
            (folder / "model-settings.json").write_text(
                json.dumps(model_settings, indent=2), encoding="utf-8"
            )
        mlserver = python.parent / "mlserver"
        command = _env_prefix(env) + [str(mlserver), "start", str(root)]
        super().__init__(command, port, workdir / f"{self.key}.log")
        self._initial = tuple(initial)


class Kserve(_V2RepositoryServer):
    """KServe's Python model server with a custom ``kserve.Model`` on ONNX Runtime.

    KServe's Python server has no batching of its own (batching is a sidecar in a cluster).
    Access logs and per-request latency logs are off; gRPC is off (it is not measured).
    """

    key = "kserve"
    title = "KServe 0.21 Python model server"

    def __init__(
        self,
        workdir: Path,
        python: Path,
        models: dict[str, Path],
        initial: Sequence[str],
        *,
        env: dict[str, str],
    ) -> None:
        port = free_port()
        root = workdir / self.key
        root.mkdir(parents=True, exist_ok=True)
        for name in ("ort_session.py", "kserve_ort.py"):
            shutil.copyfile(PEERS_SOURCE / name, root / name)
        for name, onnx_path in models.items():
            link_model(onnx_path, root / "models" / name / "model.onnx")
        peer_env = env | {
            "ZEROSERVE_PEER_MODELS_DIR": str(root / "models"),
            "ZEROSERVE_PEER_MODELS": ",".join(initial),
        }
        command = _env_prefix(peer_env) + [
            str(python),
            str(root / "kserve_ort.py"),
            "--http_port",
            str(port),
            "--grpc_port",
            str(free_port()),
            "--enable_grpc",
            "false",
            "--enable_latency_logging",
            "false",
        ]
        super().__init__(command, port, workdir / f"{self.key}.log")
