"""The gRPC benchmark's contenders, the servers they run on, and the request each sends.

One repository holds the light MLP three ways: ``light`` (ONNX Runtime, what zeroserve's
transports are compared on), and ``mlp_triton`` / ``mlp_inprocess``, the same ONNX model run
inside a Python ``model.py`` under Triton's contract and under zeroserve's in-process one
(``bench.python_backend``'s files). zeroserve serves all three; Triton, in explicit mode,
only ``mlp_triton`` (its wheel has no ONNX backend, and the in-process contract is
zeroserve's own). A grpc.aio echo server (``bench.grpc_echo``) answering at once, without
inference, shows the floor of the gRPC stack zeroserve's listener is built on.

:class:`Servers` owns what the run sends: one request body file per contender, written
before any timing (a gRPC message with its 5-byte prefix, or an HTTP binary-tensor body),
the shared-memory regions the ``light`` gRPC requests name (registered with zeroserve,
unregistered and removed on exit), and blocking gRPC channels for the checks and for each
server's ModelStatistics success count.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal, Self

import grpc
import numpy as np
import onnxruntime

from bench import python_backend
from bench.models import (
    INPUT_NAME,
    MODELS,
    OUTPUT_NAME,
    request_body,
    sample_rows,
    write_repository as write_mlp_repository,
)
from bench.server import infer_once
from bench.triton_server import TritonServer, run_triton, triton_install
from foundation.proto import grpc_service_pb2 as pb
from zeroserve.bench import (
    GrpcTarget,
    SetupClient,
    SharedMemoryRun,
    Tensor,
    TensorSpec,
    grpc_frame,
    infer_request,
    shared_memory_request,
)

SPEC: Final = MODELS["light"]
SERVICE: Final = "/inference.GRPCInferenceService"
CALL_TIMEOUT_S: Final = 60.0


@dataclass(frozen=True)
class Contender:
    """One server, protocol and model, loaded the same way at every concurrency."""

    key: str
    label: str
    server: str
    """``zeroserve``, ``triton``, ``echo``, or another name `Servers` was given."""
    protocol: Literal["http", "grpc"]
    model: str
    is_shared_memory: bool = False

    def describe(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "server": self.server,
            "protocol": self.protocol,
            "model": self.model,
            "shared_memory": "system" if self.is_shared_memory else "none",
        }


ZS_HTTP: Final = Contender("zs_http", "zeroserve HTTP/1.1, binary", "zeroserve", "http", "light")
ZS_GRPC: Final = Contender("zs_grpc", "zeroserve gRPC", "zeroserve", "grpc", "light")
ZS_GRPC_SHM: Final = Contender(
    "zs_grpc_shm", "zeroserve gRPC, system shared memory", "zeroserve", "grpc", "light", True
)
ZS_PYTHON: Final = Contender(
    "zs_python", "zeroserve gRPC, model.py in Triton's contract", "zeroserve", "grpc", "mlp_triton"
)
ZS_PYTHON_INPROCESS: Final = Contender(
    "zs_python_inprocess",
    "zeroserve gRPC, model.py in process",
    "zeroserve",
    "grpc",
    "mlp_inprocess",
)
TRITON_PYTHON: Final = Contender(
    "triton_python", "Triton 2.51 gRPC, model.py", "triton", "grpc", "mlp_triton"
)
GRPC_ECHO: Final = Contender(
    "grpc_echo", "grpc.aio echo, no inference (bench/grpc_echo.py)", "echo", "grpc", "light"
)
CONTENDERS: Final = (
    ZS_HTTP,
    ZS_GRPC,
    ZS_GRPC_SHM,
    ZS_PYTHON,
    ZS_PYTHON_INPROCESS,
    TRITON_PYTHON,
    GRPC_ECHO,
)


def write_repository(workdir: Path) -> Path:
    """The repository both servers read (see the module docstring)."""
    root = workdir / "models"
    python_backend.write_repository(root)
    write_mlp_repository(root, [SPEC], max_queue_delay_us=0)
    return root


def start_triton(
    args: argparse.Namespace, stack: contextlib.ExitStack, workdir: Path, repository: Path
) -> TritonServer | None:
    """Real Triton serving the Python model (only it: explicit mode), or None (said why).

    ``args.no_triton`` leaves it out; the server and the ONNX Runtime it borrows stop with
    ``stack``.
    """
    if args.no_triton:
        print("real Triton left out (--no-triton)")
        return None
    install = triton_install()
    if isinstance(install, str):
        print(f"real Triton not run: {install}")
        return None
    stack.enter_context(python_backend.onnxruntime_for_triton(workdir / "ort"))
    server: TritonServer = stack.enter_context(
        run_triton(
            install,
            repository,
            workdir,
            "--model-control-mode=explicit",
            "--load-model=mlp_triton",
            "--log-verbose=0",
        )
    )
    return server


class Servers:
    """Where each contender sends what; a context manager releasing the regions and
    channels. ``triton`` None leaves Triton's contender out; ``echo`` is the echo server's
    pid and address, ``extra`` more servers' by name; ``contenders`` those requests are
    prepared for."""

    def __init__(
        self,
        workdir: Path,
        zeroserve_pid: int,
        http_port: int,
        grpc_address: str,
        triton: TritonServer | None,
        echo: tuple[int, str],
        *,
        extra: Mapping[str, tuple[int, str]] | None = None,
        contenders: Sequence[Contender] = CONTENDERS,
    ) -> None:
        self.workdir = workdir
        self._contenders = tuple(contenders)
        self.http_port = http_port
        self.pids = {"zeroserve": zeroserve_pid, "echo": echo[0]}
        self.grpc_addresses = {"zeroserve": grpc_address, "echo": echo[1]}
        if triton is not None:
            self.pids["triton"] = triton.process.pid
            self.grpc_addresses["triton"] = triton.grpc_address
        for name, (pid, address) in (extra or {}).items():
            self.pids[name] = pid
            self.grpc_addresses[name] = address
        self.row = sample_rows(SPEC, 1)
        self.channels = {
            name: grpc.insecure_channel(address) for name, address in self.grpc_addresses.items()
        }
        self.messages: dict[str, bytes] = {}
        self.files: dict[str, Path] = {}
        self.http_header_length = 0
        self._setup: SetupClient | None = None
        self.shared_memory: SharedMemoryRun | None = None

    def __enter__(self) -> Self:
        try:
            self._prepare()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _prepare(self) -> None:
        tensor = Tensor(INPUT_NAME, "FP32", self.row)
        for contender in self._contenders:
            if contender.protocol == "grpc" and not contender.is_shared_memory:
                self.messages[contender.key] = infer_request(contender.model, None, [tensor])
        host, _, port = self.grpc_addresses["zeroserve"].rpartition(":")
        self._setup = SetupClient(GrpcTarget(host, int(port)), CALL_TIMEOUT_S)
        output = TensorSpec(OUTPUT_NAME, "FP32", (-1, SPEC.output_size))
        self.shared_memory = SharedMemoryRun(
            self._setup, [[tensor]], [output], [4 * SPEC.output_size], slots=1
        ).__enter__()
        layout = self.shared_memory.layout
        self.messages[ZS_GRPC_SHM.key] = shared_memory_request(
            ZS_GRPC_SHM.model, None, layout.inputs[0], layout.outputs[0]
        )
        for key, message in self.messages.items():
            self.files[key] = self.workdir / f"{key}.grpc"
            self.files[key].write_bytes(grpc_frame(message))
        body = request_body(SPEC, self.row, "binary")
        assert body.header_length is not None
        self.http_header_length = body.header_length
        self.files[ZS_HTTP.key] = self.workdir / "zs_http.body"
        self.files[ZS_HTTP.key].write_bytes(body.body)

    def close(self) -> None:
        if self.shared_memory is not None:
            self.shared_memory.close()
        if self._setup is not None:
            self._setup.__exit__(None, None, None)
        for channel in self.channels.values():
            channel.close()

    def url(self, contender: Contender) -> str:
        if contender.protocol == "http":
            return f"http://127.0.0.1:{self.http_port}/v2/models/{contender.model}/infer"
        return f"http://{self.grpc_addresses[contender.server]}{SERVICE}/ModelInfer"

    def headers(self, contender: Contender) -> tuple[str, ...]:
        if contender.protocol == "http":
            return (
                "content-type: application/octet-stream",
                f"inference-header-content-length: {self.http_header_length}",
            )
        return ("content-type: application/grpc", "te: trailers")

    def call(self, server: str, method: str, request: bytes) -> bytes:
        """One blocking call; raises grpc.RpcError on a status other than OK."""
        stub: grpc.UnaryUnaryMultiCallable[bytes, bytes] = self.channels[server].unary_unary(
            f"{SERVICE}/{method}"
        )
        answer: bytes = stub(request, timeout=CALL_TIMEOUT_S)
        return answer

    def successes(self, contender: Contender) -> int:
        """The server's count of successful requests to the contender's model."""
        request = pb.ModelStatisticsRequest(name=contender.model)
        answer = pb.ModelStatisticsResponse.FromString(
            self.call(contender.server, "ModelStatistics", request.SerializeToString())
        )
        return sum(int(s.inference_stats.success.count) for s in answer.model_stats)


def check_answers(servers: Servers, contenders: list[Contender]) -> None:
    """Each contender's request, sent once with a real client, answers what ONNX Runtime
    computes for the row (the echo server: an answer of the right shape); raises otherwise
    (a gRPC error raises with its status)."""
    model_path = servers.workdir / "models" / SPEC.name / "1" / "model.onnx"
    session = onnxruntime.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    (expected,) = session.run([OUTPUT_NAME], {INPUT_NAME: servers.row})
    for contender in contenders:
        if contender.protocol == "http":
            body = request_body(SPEC, servers.row, "binary")
            got = infer_once(servers.http_port, contender.model, body)
        else:
            answer = pb.ModelInferResponse.FromString(
                servers.call(contender.server, "ModelInfer", servers.messages[contender.key])
            )
            got = _output(answer, servers, contender)
        if contender.server.startswith("echo"):
            if got.shape != expected.shape:
                raise RuntimeError(f"{contender.label} answered shape {got.shape}")
            continue
        if not np.allclose(got, expected, rtol=1e-4, atol=1e-5):
            raise RuntimeError(f"{contender.label} answered {got}, ONNX Runtime {expected}")


def _output(answer: pb.ModelInferResponse, servers: Servers, contender: Contender) -> np.ndarray:
    (output,) = answer.outputs
    shape = [int(d) for d in output.shape]
    if contender.is_shared_memory:
        shm = servers.shared_memory
        assert shm is not None and shm.output_object is not None
        place = shm.layout.outputs[0][0].place
        data = shm.output_object.read(place.offset, 4 * int(np.prod(shape)))
    else:
        data = answer.raw_output_contents[0]
    return np.frombuffer(data, dtype="<f4").reshape(shape)
