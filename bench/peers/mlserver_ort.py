# mypy: allow-subclassing-any
"""An MLServer custom runtime serving one ONNX model with ONNX Runtime.

Written the way MLServer's documentation shows custom runtimes (``MLModel`` with ``load``,
``predict``, ``unload``; inputs and outputs through ``NumpyCodec``). ``predict`` calls the
session directly, as MLServer's own runtimes call their frameworks: with
``parallel_workers: 0`` that runs on the server's event loop; by default (one parallel
worker) it runs in MLServer's worker process. Adaptive batching, when the model settings
enable it, hands ``predict`` requests already concatenated along the batch dimension.
"""

from __future__ import annotations

from typing import Any

from mlserver import MLModel  # type: ignore[import-not-found]
from mlserver.codecs import NumpyCodec  # type: ignore[import-not-found]
from mlserver.types import InferenceRequest, InferenceResponse  # type: ignore[import-not-found]
from mlserver.utils import get_model_uri  # type: ignore[import-not-found]
from ort_session import open_session  # type: ignore[import-not-found]


class OnnxRuntimeModel(MLModel):
    """``parameters.uri`` in model-settings.json names the .onnx file."""

    async def load(self) -> bool:
        path = await get_model_uri(self.settings)
        self._session: Any = open_session(path)
        self._output_names = [o.name for o in self._session.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feeds = {i.name: NumpyCodec.decode_input(i) for i in payload.inputs}
        values = self._session.run(self._output_names, feeds)
        outputs = [
            NumpyCodec.encode_output(name, value)
            for name, value in zip(self._output_names, values, strict=True)
        ]
        return InferenceResponse(model_name=self.name, model_version=self.version, outputs=outputs)

    async def unload(self) -> bool:
        self._session = None
        return True
