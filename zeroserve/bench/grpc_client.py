"""gRPC for ``zeroserve bench --protocol grpc``: where the server is, the channels the load
runs on, and plain blocking calls for setup.

The load calls ModelInfer as a *generic* unary method with no serializers: requests are
``ModelInferRequest`` bytes serialized once before the clock starts and answers are left
as bytes, so that the client pays no protobuf encoding or decoding per call. A channel is
one HTTP/2 connection (each opened with its own subchannel pool, or grpc would share one
connection between channels to the same address); a level spreads its calls over as many
channels as its concurrency needs (:class:`ChannelSet`).

Setup (metadata, config, the check call, shared-memory registration) runs on a blocking
channel of its own (:class:`SetupClient`); every call there has a deadline, so an address
where no gRPC server answers fails with the reason instead of hanging.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from foundation.proto import grpc_service_pb2 as pb
from zeroserve.bench.shared_memory import SharedMemoryError

SERVICE: Final = "/inference.GRPCInferenceService"
INFER_METHOD: Final = f"{SERVICE}/ModelInfer"
DEFAULT_PORT: Final = 8001
"""Triton's gRPC port."""
CHANNEL_OPTIONS: Final = (
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
)
"""Each channel its own connection; no client-side message size limit (the server's
applies)."""
M = TypeVar("M", bound=Message)
_TARGET: Final = re.compile(r"^(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^:/\[\]]+))(?::(?P<port>\d+))?$")


class GrpcTargetError(ValueError):
    """The address is not one the gRPC client can load."""


@dataclass(frozen=True)
class GrpcTarget:
    """A gRPC server's address."""

    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> GrpcTarget:
        """``host:port``, ``grpc://host:port`` or ``[v6]:port`` (port 8001 when left out)."""
        address = text.strip()
        if address.startswith("grpc://"):
            address = address[len("grpc://") :]
        elif "://" in address:
            raise GrpcTargetError(
                f"with --protocol grpc give the gRPC address (host:port or grpc://host:port), "
                f"not {text!r}"
            )
        match = _TARGET.match(address.rstrip("/"))
        port = int(match.group("port")) if match and match.group("port") else DEFAULT_PORT
        if match is None or not 0 < port < 65536:
            raise GrpcTargetError(f"not a gRPC address (host:port): {text!r}")
        return cls(match.group("v6") or match.group("host"), port)

    @property
    def address(self) -> str:
        """``host:port`` as grpc channels take it."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def grpc_frame(message: bytes) -> bytes:
    """``message`` as one gRPC length-prefixed message (uncompressed): what goes in the
    body of an HTTP/2 request to a gRPC method."""
    return b"\x00" + len(message).to_bytes(4, "big") + message


def error_kind(code: grpc.StatusCode) -> str:
    """How an error of ``code`` is counted: ``grpc_unavailable``, ``grpc_invalid_argument``..."""
    return f"grpc_{code.name.lower()}"


class ChannelSet:
    """grpc.aio channels to one target, opened as slots first use them: slot ``k`` calls on
    channel ``k // streams_per_connection``. Close with :meth:`close`."""

    def __init__(self, target: GrpcTarget, streams_per_connection: int) -> None:
        self._target = target
        self._streams = streams_per_connection
        self._channels: list[grpc.aio.Channel] = []
        self._infer: list[grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]] = []
        self.opened = 0
        """Channels opened so far (closed ones included)."""

    def infer(self, slot: int) -> grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]:
        """ModelInfer, bytes in and out, on the channel of ``slot``."""
        index = slot // self._streams
        while len(self._channels) <= index:
            channel = grpc.aio.insecure_channel(self._target.address, options=CHANNEL_OPTIONS)
            self._channels.append(channel)
            self._infer.append(channel.unary_unary(INFER_METHOD))
            self.opened += 1
        return self._infer[index]

    async def close(self) -> None:
        channels, self._channels = self._channels, []
        self._infer = []
        await asyncio.gather(*(channel.close(grace=None) for channel in channels))


class SetupError(Exception):
    """A setup call failed; the message says why, for the user."""


class SetupClient:
    """Blocking calls made before the load (never on the timed path); a context manager
    that closes its channel."""

    def __init__(self, target: GrpcTarget, timeout_s: float) -> None:
        self._target = target
        self._timeout_s = timeout_s
        self._channel = grpc.insecure_channel(target.address, options=CHANNEL_OPTIONS)

    def __enter__(self) -> SetupClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._channel.close()

    def _call(self, method: str, request: bytes | Message, what: str) -> bytes:
        payload = request if isinstance(request, bytes) else request.SerializeToString()
        call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = self._channel.unary_unary(
            f"{SERVICE}/{method}"
        )
        try:
            answer: bytes = call(payload, timeout=self._timeout_s)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise SetupError(
                    f"cannot reach a gRPC server at {self._target.address} "
                    f"({code.name if code else 'error'}: {details})"
                ) from None
            raise SetupError(
                f"{what} answered {code.name if code else 'an error'}: {details}"
            ) from None
        return answer

    def model_metadata(self, model: str, version: str | None) -> dict[str, Any]:
        """The metadata in the JSON form HTTP gives (``inputs``, ``outputs``)."""
        request = pb.ModelMetadataRequest(name=model, version=version or "")
        answer = _parse(
            pb.ModelMetadataResponse, self._call("ModelMetadata", request, "model metadata")
        )

        def tensors(items: Any) -> list[dict[str, Any]]:
            return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in items]

        return {
            "name": answer.name,
            "inputs": tensors(answer.inputs),
            "outputs": tensors(answer.outputs),
        }

    def max_batch_size(self, model: str, version: str | None) -> int | None:
        """The configuration's ``max_batch_size``, None where the server gives no config."""
        request = pb.ModelConfigRequest(name=model, version=version or "")
        try:
            answer = self._call("ModelConfig", request, "model config")
        except SetupError:
            return None
        return int(_parse(pb.ModelConfigResponse, answer).config.max_batch_size)

    def infer(self, request: bytes) -> pb.ModelInferResponse:
        return _parse(pb.ModelInferResponse, self._call("ModelInfer", request, "the check call"))

    # -- zeroserve.bench.shared_memory.Registrar -------------------------------------------

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        request = pb.SystemSharedMemoryRegisterRequest(
            name=name, key=key, offset=offset, byte_size=byte_size
        )
        try:
            self._call("SystemSharedMemoryRegister", request, f"registering region {name!r}")
        except SetupError as exc:
            raise SharedMemoryError(
                f"{exc} (the server must run on this machine and see its /dev/shm)"
            ) from None

    def unregister(self, name: str) -> None:
        request = pb.SystemSharedMemoryUnregisterRequest(name=name)
        try:
            self._call("SystemSharedMemoryUnregister", request, f"unregistering region {name!r}")
        except SetupError as exc:
            raise SharedMemoryError(str(exc)) from None


def _parse(kind: type[M], data: bytes) -> M:
    try:
        return kind.FromString(data)
    except DecodeError:
        raise SetupError(f"the server's answer is not a {kind.__name__}") from None
