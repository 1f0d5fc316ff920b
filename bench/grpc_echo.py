"""The floor of a grpc.aio server: ModelInfer answered at once with a fixed response, no
inference, no decoding, served the way zeroserve's gRPC listener is (grpc.aio on uvloop,
a generic handler taking and giving bytes).

``bench/grpc_transports.py`` loads it like a server under test, to show how much of zeroserve's gRPC
figures is grpc.aio's own cost per call. It also answers ModelStatistics with the number
of ModelInfer calls it answered, so the benchmark can check its count like the others', and
the light MLP's ModelMetadata and ModelConfig, for ``zeroserve bench`` to build requests.

    python -m bench.grpc_echo PORT
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import grpc
import uvloop

from foundation.grpc_front.app import CallContext, GrpcApp, StreamRpc, UnaryRpc
from foundation.grpc_front.server import serve_grpc_front
from foundation.grpc_limits import GrpcLimits
from foundation.proto import grpc_service_pb2 as pb
from foundation.serving import bind_socket

SERVICE: Final = "inference.GRPCInferenceService"
START_TIMEOUT_S: Final = 60.0
STOP_TIMEOUT_S: Final = 10.0
OUTPUT_BYTES: Final = 40
"""The light MLP's answer: ten float32 values."""
INPUT_SIZE: Final = 256
"""The light MLP's input width, as the metadata tells clients (the echo reads nothing)."""


class _Echo(grpc.GenericRpcHandler):
    def __init__(self, model: str) -> None:
        self.calls = 0
        response = pb.ModelInferResponse(model_name=model, model_version="1")
        response.outputs.add(name="OUTPUT0", datatype="FP32", shape=[1, OUTPUT_BYTES // 4])
        response.raw_output_contents.append(bytes(OUTPUT_BYTES))
        self._answer = response.SerializeToString()
        self._model = model

    async def _infer(self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        self.calls += 1
        return self._answer

    async def _statistics(
        self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> bytes:
        answer = pb.ModelStatisticsResponse()
        stats = answer.model_stats.add(name=self._model, version="1")
        stats.inference_stats.success.count = self.calls
        return answer.SerializeToString()

    async def _metadata(self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        answer = pb.ModelMetadataResponse(name=self._model, versions=["1"], platform="echo")
        answer.inputs.add(name="INPUT0", datatype="FP32", shape=[-1, INPUT_SIZE])
        answer.outputs.add(name="OUTPUT0", datatype="FP32", shape=[-1, OUTPUT_BYTES // 4])
        return answer.SerializeToString()

    async def _config(self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        answer = pb.ModelConfigResponse()
        answer.config.name = self._model
        answer.config.max_batch_size = 32
        return answer.SerializeToString()

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        method = handler_call_details.method
        if method == f"/{SERVICE}/ModelMetadata":
            return grpc.unary_unary_rpc_method_handler(self._metadata)
        if method == f"/{SERVICE}/ModelConfig":
            return grpc.unary_unary_rpc_method_handler(self._config)
        if method == f"/{SERVICE}/ModelInfer":
            return grpc.unary_unary_rpc_method_handler(self._infer)
        if method == f"/{SERVICE}/ModelStatistics":
            return grpc.unary_unary_rpc_method_handler(self._statistics)
        return None


def _front_rpcs(echo: _Echo) -> dict[str, UnaryRpc | StreamRpc]:
    """The echo's methods for `foundation.grpc_front` (no context: the echo uses none)."""

    def unary(method: Any) -> UnaryRpc:
        async def handle(request: bytes, call: CallContext) -> bytes:
            answer: bytes = await method(request, None)
            return answer

        return UnaryRpc(handle)

    return {
        f"/{SERVICE}/ModelMetadata": unary(echo._metadata),
        f"/{SERVICE}/ModelConfig": unary(echo._config),
        f"/{SERVICE}/ModelInfer": unary(echo._infer),
        f"/{SERVICE}/ModelStatistics": unary(echo._statistics),
    }


async def serve(port: int, model: str, frontend: str = "aio") -> None:
    """Serve on 127.0.0.1:``port`` with ``frontend`` (grpc.aio or h2corn, as
    ``GrpcLimits.grpc_frontend`` names them) until SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    echo = _Echo(model)
    if frontend == "h2corn":
        limits = GrpcLimits(grpc_frontend="h2corn")
        app = GrpcApp(
            _front_rpcs(echo),
            max_receive_bytes=limits.grpc_max_receive_bytes,
            max_send_bytes=limits.grpc_max_send_bytes,
            max_concurrent_rpcs=limits.grpc_max_concurrent_rpcs,
        )
        with bind_socket("127.0.0.1", port) as sock:
            async with serve_grpc_front(app, sock, limits, drain_timeout_s=1.0):
                print(f"grpc echo (h2corn) listening on 127.0.0.1:{port}", flush=True)
                await stop.wait()
        return
    server = grpc.aio.server(handlers=[echo])
    if server.add_insecure_port(f"127.0.0.1:{port}") == 0:
        raise SystemExit(f"cannot bind 127.0.0.1:{port}")
    await server.start()
    print(f"grpc echo listening on 127.0.0.1:{port}", flush=True)
    await stop.wait()
    await server.stop(grace=1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("port", type=int)
    parser.add_argument("--model", default="light")
    parser.add_argument("--frontend", choices=["aio", "h2corn"], default="aio")
    args = parser.parse_args(argv)
    uvloop.run(serve(args.port, args.model, args.frontend))
    return 0


@contextlib.contextmanager
def run_echo(port: int, log_path: Path, frontend: str = "aio") -> Iterator[subprocess.Popen[bytes]]:
    """The echo server in a process of its own on ``port`` until the block ends (stopped,
    killed if it overstays, whatever happens); raises with its log if it never listens."""
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "bench.grpc_echo", str(port), "--frontend", frontend],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=Path(__file__).resolve().parents[1],
        )
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            try:
                grpc.channel_ready_future(channel).result(timeout=START_TIMEOUT_S)
            except grpc.FutureTimeoutError:
                raise RuntimeError(f"grpc echo did not start:\n{log_path.read_text()}") from None
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=STOP_TIMEOUT_S)


if __name__ == "__main__":
    sys.exit(main())
