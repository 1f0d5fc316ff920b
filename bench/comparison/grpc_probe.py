"""What the comparison needs to load a server over gRPC with h2load, and to trust the count.

One pre-encoded batch-1 ModelInferRequest per server (framed for an HTTP/2 body), a real
gRPC call to check its answer before anything is timed, and the server's own
ModelStatistics success count, read around each run (h2load counts a gRPC error, which
arrives as an HTTP 200 with its status in the trailers, as a success).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import grpc
import numpy as np

from bench.models import INPUT_NAME
from foundation.proto import grpc_service_pb2 as pb
from zeroserve.bench import Tensor, grpc_frame, infer_request

SERVICE: Final = "/inference.GRPCInferenceService"
CALL_TIMEOUT_S: Final = 60.0


class GrpcProbe:
    """One server's gRPC endpoint for ``model``; :meth:`close` releases the channel."""

    def __init__(self, address: str, model: str, row: np.ndarray, body_file: Path) -> None:
        self.address = address
        self.model = model
        self.url = f"http://{address}{SERVICE}/ModelInfer"
        self.message = infer_request(model, None, [Tensor(INPUT_NAME, "FP32", row)])
        self.body_file = body_file
        body_file.write_bytes(grpc_frame(self.message))
        self._channel = grpc.insecure_channel(address)

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: str, request: bytes) -> bytes:
        stub: grpc.UnaryUnaryMultiCallable[bytes, bytes] = self._channel.unary_unary(
            f"{SERVICE}/{method}"
        )
        answer: bytes = stub(request, timeout=CALL_TIMEOUT_S)
        return answer

    def infer(self) -> np.ndarray:
        """The first output of one call with the benchmark's request; raises
        ``grpc.RpcError`` on a status other than OK."""
        answer = pb.ModelInferResponse.FromString(self._call("ModelInfer", self.message))
        output = answer.outputs[0]
        shape = [int(d) for d in output.shape]
        return np.frombuffer(answer.raw_output_contents[0], dtype="<f4").reshape(shape)

    def successes(self) -> int:
        """The server's count of successful requests to the model, all versions."""
        request = pb.ModelStatisticsRequest(name=self.model).SerializeToString()
        answer = pb.ModelStatisticsResponse.FromString(self._call("ModelStatistics", request))
        return sum(int(s.inference_stats.success.count) for s in answer.model_stats)
