"""The activator's gRPC endpoint over TLS on each front end: a call through it reaches a
worker (whose channel stays plaintext) for a client trusting the CA, and a plaintext
client is refused; with mutual TLS only a client with a certificate from the CA is
served."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from activator.core import ActivatorCore
from activator.grpc.server import GrpcListener
from foundation.proto import grpc_service_pb2 as pb
from foundation.serving import ServerStartError
from tests.activator.fakes import FakeStore, RecordingActivate
from tests.activator.grpc.conftest import answered_by, infer_request, place, settings
from tests.activator.grpc.fake_worker import SERVICE, FakeWorker
from tests.certificates import Certificates, make_certificates

pytestmark = pytest.mark.anyio

FRONTENDS = ["aio", "h2corn"]
CALL_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


def tls_settings(certs: Certificates, frontend: str, *, mutual: bool) -> dict[str, Any]:
    return {
        "grpc_frontend": frontend,
        "grpc_use_ssl": True,
        "grpc_use_ssl_mutual": mutual,
        "grpc_server_cert": certs.server_cert,
        "grpc_server_key": certs.server_key,
        "grpc_root_cert": certs.ca if mutual else None,
    }


@contextlib.asynccontextmanager
async def activator(store: FakeStore, **overrides: Any) -> AsyncIterator[GrpcListener]:
    config = settings(**overrides)
    listener = GrpcListener(
        ActivatorCore(config, store, RecordingActivate(), "act-1"), config, port=0
    )
    try:
        async with listener:
            yield listener
    finally:
        await listener.aclose()


def credentials(certs: Certificates, identity: str | None = None) -> grpc.ChannelCredentials:
    if identity is None:
        return grpc.ssl_channel_credentials(certs.read("ca"))
    return grpc.ssl_channel_credentials(
        certs.read("ca"), certs.read(f"{identity}_key"), certs.read(f"{identity}_cert")
    )


async def infer(channel: grpc.aio.Channel) -> pb.ModelInferResponse:
    call: grpc.aio.UnaryUnaryMultiCallable[pb.ModelInferRequest, pb.ModelInferResponse]
    call = channel.unary_unary(
        f"/{SERVICE}/ModelInfer",
        request_serializer=pb.ModelInferRequest.SerializeToString,
        response_deserializer=pb.ModelInferResponse.FromString,
    )
    return await call(infer_request("m"), timeout=CALL_TIMEOUT_S)


async def assert_refused(channel: grpc.aio.Channel) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await infer(channel)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("frontend", FRONTENDS)
async def test_tls_reaches_the_worker_and_refuses_plaintext(
    certs: Certificates, frontend: str
) -> None:
    store = FakeStore()
    store.register("m")
    async with (
        FakeWorker("w1") as worker,
        activator(store, **tls_settings(certs, frontend, mutual=False)) as listener,
    ):
        await place(store, "m", worker)
        async with grpc.aio.secure_channel(listener.address, credentials(certs)) as channel:
            assert answered_by(await infer(channel)) == "w1"
        async with grpc.aio.insecure_channel(listener.address) as channel:
            await assert_refused(channel)


@pytest.mark.parametrize("frontend", FRONTENDS)
async def test_mutual_tls_serves_only_clients_with_a_trusted_certificate(
    certs: Certificates, frontend: str
) -> None:
    store = FakeStore()
    store.register("m")
    async with (
        FakeWorker("w1") as worker,
        activator(store, **tls_settings(certs, frontend, mutual=True)) as listener,
    ):
        await place(store, "m", worker)
        trusted = credentials(certs, "client")
        async with grpc.aio.secure_channel(listener.address, trusted) as channel:
            assert answered_by(await infer(channel)) == "w1"
        for refused in (credentials(certs), credentials(certs, "stranger")):
            async with grpc.aio.secure_channel(listener.address, refused) as channel:
                await assert_refused(channel)
    assert len(worker.requests) == 1


@pytest.mark.parametrize("frontend", FRONTENDS)
async def test_an_unusable_key_fails_the_start(
    certs: Certificates, tmp_path: Path, frontend: str
) -> None:
    overrides = tls_settings(certs, frontend, mutual=False)
    overrides["grpc_server_key"] = certs.client_key
    config = settings(**overrides)
    with pytest.raises(ServerStartError, match="grpc_server_key .* are not a usable key"):
        GrpcListener(
            ActivatorCore(config, FakeStore(), RecordingActivate(), "act-1"), config, port=0
        )
