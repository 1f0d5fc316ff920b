# mypy: allow-subclassing-any
"""A KServe Python model server serving ONNX models with ONNX Runtime (Open Inference
Protocol, V2).

A ``kserve.Model`` per model, written as KServe's custom-model documentation shows, and a
``ModelRepository`` whose ``load`` builds one from ``<models dir>/<name>/model.onnx``: KServe
calls it for ``POST /v2/repository/models/{name}/load`` (its model repository extension), so
that load and unload can be timed as for the other servers. Access logs and the per-request
latency log line are off, as a benchmark runs them.

    python kserve_ort.py --http_port 8080 --enable_grpc false --enable_latency_logging false
    (environment: ZEROSERVE_PEER_MODELS_DIR, ZEROSERVE_PEER_MODELS = names to load at start)
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from pathlib import Path
from typing import Any

import kserve  # type: ignore[import-not-found]
from ort_session import open_session, tensor_metadata  # type: ignore[import-not-found]


class OnnxRuntimeModel(kserve.Model):
    """One ONNX model; ``load`` opens its session."""

    def __init__(self, name: str, path: Path) -> None:
        super().__init__(name)
        self._path = path
        self._session: Any = None
        self._output_names: list[str] = []

    def load(self) -> bool:
        self._session = open_session(self._path)
        self._output_names = [o.name for o in self._session.get_outputs()]
        self.ready = True
        return self.ready

    async def predict(
        self,
        payload: kserve.InferRequest,
        headers: dict[str, str] | None = None,
        response_headers: dict[str, str] | None = None,
    ) -> kserve.InferResponse:
        feeds = {i.name: i.as_numpy() for i in payload.inputs}
        values = self._session.run(self._output_names, feeds)
        outputs = []
        for name, value in zip(self._output_names, values, strict=True):
            output = kserve.InferOutput(name=name, shape=list(value.shape), datatype="FP32")
            output.set_data_from_numpy(value, binary_data=False)
            outputs.append(output)
        # KServe's response model needs an id; V2 requests may carry none.
        response_id = payload.id or str(uuid.uuid4())
        return kserve.InferResponse(
            model_name=self.name, infer_outputs=outputs, response_id=response_id
        )

    def get_input_types(self) -> list[dict[str, Any]]:
        return tensor_metadata(self._session.get_inputs()) if self._session else []

    def get_output_types(self) -> list[dict[str, Any]]:
        return tensor_metadata(self._session.get_outputs()) if self._session else []

    def stop(self) -> None:
        self._session = None
        self.ready = False


class FolderRepository(kserve.ModelRepository):
    """Models by name from ``<models_dir>/<name>/model.onnx``."""

    async def load(self, name: str) -> bool:
        model = OnnxRuntimeModel(name, Path(self.models_dir) / name / "model.onnx")
        # The session is built in a thread so that the server keeps answering meanwhile.
        await asyncio.to_thread(model.load)
        self.update(model)
        return model.ready


def main() -> None:
    models_dir = os.environ["ZEROSERVE_PEER_MODELS_DIR"]
    names = [n for n in os.environ.get("ZEROSERVE_PEER_MODELS", "").split(",") if n]
    repository = FolderRepository(models_dir)
    models = []
    for name in names:
        model = OnnxRuntimeModel(name, Path(models_dir) / name / "model.onnx")
        model.load()
        models.append(model)
    server = kserve.ModelServer(registered_models=repository, enable_latency_logging=False)
    # KServe configures logging when the server is built; its access log goes off after.
    logging.getLogger("uvicorn.access").disabled = True
    server.start(models)


if __name__ == "__main__":
    main()
