"""The contenders that run the engine inside a Python ``model.py``: real Triton and zeroserve.

Both serve the same computation as the ONNX contenders, the generated MLP run by ONNX
Runtime, but from ``bench.python_backend``'s ``model.py`` files (one ``InferenceSession``
with ONNX Runtime's default options, the rows of a batch run together):

* :class:`TritonPeer`: real Triton 2.51 from the ``nvidia-pytriton`` wheel
  (``bench.triton_server`` installs it into its cache folder and starts it on free ports), Python
  backend, Triton's contract, in explicit mode loading through its repository API;
* :class:`ZeroservePython`: ``python -m data_plane`` serving zeroserve's in-process
  contract: the yardstick issue 19 sets the native ONNX runtime against.

Each model folder gets the ``.onnx`` file as a hard link (as every contender's does) and a
Python-backend ``config.pbtxt`` batching up to the same size as the ONNX models.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from pathlib import Path

from bench import python_backend
from bench.comparison.contenders import (
    Contender,
    ContenderError,
    ZeroserveDirect,
    link_model,
    repository_call,
)
from bench.models import MAX_BATCH_SIZE, MlpSpec
from bench.triton_server import TritonInstall, TritonServer, run_triton


def write_python_models(
    repository: Path, models: Mapping[str, tuple[MlpSpec, Path]], source: str
) -> None:
    """One folder per model: ``config.pbtxt``, ``1/model.py`` (``source``) and
    ``1/model.onnx`` linked to the given file."""
    for name, (spec, onnx_path) in models.items():
        version = repository / name / "1"
        link_model(onnx_path, version / "model.onnx")
        (version / "model.py").write_text(source, encoding="utf-8")
        (repository / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "python"\nmax_batch_size: {MAX_BATCH_SIZE}\n'
            f'input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {spec.input_size} ] }} ]\n'
            f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {spec.output_size} ] }} ]\n'
            "instance_group [ { count: 1 kind: KIND_CPU } ]\ndynamic_batching { }\n",
            encoding="utf-8",
        )


class ZeroservePython(ZeroserveDirect):
    """zeroserve's data plane serving the models as in-process ``model.py`` files."""

    key = "zeroserve-python"
    title = "zeroserve, Python model (ORT in model.py)"

    def __init__(
        self,
        workdir: Path,
        models: Mapping[str, tuple[MlpSpec, Path]],
        initial: Sequence[str],
    ) -> None:
        repository = workdir / "zeroserve-python" / "models"
        write_python_models(repository, models, python_backend.INPROCESS_MODEL)
        super().__init__(workdir, repository, initial, log_name="zeroserve-python.log")


class TritonPeer(Contender):
    """Real Triton 2.51, Python backend, the same ``model.py`` under Triton's contract.

    Triton's stub embeds the system's Python 3.11; ``onnxruntime`` is made visible to it
    for as long as the server runs (``bench.python_backend.onnxruntime_for_triton``).
    """

    key = "triton"
    title = "Triton 2.51, Python backend (ORT in model.py)"
    protocols = ("json", "binary", "grpc")

    def __init__(
        self,
        workdir: Path,
        install: TritonInstall,
        models: Mapping[str, tuple[MlpSpec, Path]],
        initial: Sequence[str],
    ) -> None:
        self._root = workdir / "triton"
        self._repository = self._root / "models"
        write_python_models(self._repository, models, python_backend.TRITON_MODEL)
        self._install = install
        self._initial = tuple(initial)
        self._stack = contextlib.ExitStack()
        self._server: TritonServer | None = None

    @property
    def server(self) -> TritonServer:
        if self._server is None:
            raise ContenderError("triton: not started")
        return self._server

    @property
    def url(self) -> str:
        return self.server.http_url

    @property
    def grpc_address(self) -> str | None:
        return self.server.grpc_address

    @property
    def pid(self) -> int:
        return self.server.process.pid

    @property
    def command(self) -> list[str]:
        return [str(part) for part in self.server.process.args]  # type: ignore[union-attr]

    def start(self) -> None:
        try:
            self._stack.enter_context(python_backend.onnxruntime_for_triton(self._root / "ort"))
            self._server = self._stack.enter_context(
                run_triton(
                    self._install,
                    self._repository,
                    self._root,
                    "--model-control-mode=explicit",
                    *(f"--load-model={name}" for name in self._initial),
                    "--log-verbose=0",
                )
            )
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        self._server = None
        self._stack.close()

    def load(self, model: str) -> None:
        repository_call(self.server.http_port, self.key, model, "load")

    def unload(self, model: str) -> None:
        repository_call(self.server.http_port, self.key, model, "unload")
