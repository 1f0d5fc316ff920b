"""gRPC over TLS on each front end (Triton's ``--grpc-use-ssl*`` flags): tritonclient with
the CA infers over TLS and a plaintext client is refused; with mutual TLS a client without
a certificate, or with one from another CA, is refused and one with the CA's is served;
``zeroserve serve`` takes Triton's flags, and refuses unusable PEM files at start."""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

import data_plane.server  # noqa: E402
from data_plane.settings import DataPlaneSettings  # noqa: E402
from foundation.grpc_limits import GrpcLimits  # noqa: E402
from tests.certificates import Certificates, make_certificates  # noqa: E402
from tests.data_plane.grpc.serving import serving  # noqa: E402
from tests.integration.conftest import start_server  # noqa: E402
from tests.models import write_onnx_add_sub  # noqa: E402
from tests.triton_oracle import free_ports  # noqa: E402
from zeroserve.cli import main  # noqa: E402

FRONTENDS = ["aio", "h2corn"]
CALL_TIMEOUT_S = 30.0
"""A refused client fails at once; this only bounds a server that would hang it."""
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tls") / "repo"
    write_onnx_add_sub(path, "add_sub", dims=(4,), max_batch_size=8)
    return path


def tls_limits(certs: Certificates, frontend: str, *, mutual: bool = False) -> GrpcLimits:
    return GrpcLimits(
        grpc_frontend=frontend,  # type: ignore[arg-type]
        grpc_use_ssl=True,
        grpc_use_ssl_mutual=mutual,
        grpc_server_cert=certs.server_cert,
        grpc_server_key=certs.server_key,
        grpc_root_cert=certs.ca if mutual else None,
    )


def client(address: str, **options: Any) -> Any:
    return grpcclient.InferenceServerClient(address, **options)


def tls_client(address: str, certs: Certificates, identity: str | None = None) -> Any:
    """A TLS client trusting the test CA, presenting ``identity`` (``client`` or
    ``stranger``) when given."""
    options: dict[str, Any] = {"ssl": True, "root_certificates": str(certs.ca)}
    if identity is not None:
        options["certificate_chain"] = str(getattr(certs, f"{identity}_cert"))
        options["private_key"] = str(getattr(certs, f"{identity}_key"))
    return client(address, **options)


def assert_infers(triton: Any) -> None:
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    b = np.full((1, 4), 10.0, dtype=np.float32)
    inputs = [grpcclient.InferInput(n, [1, 4], "FP32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = triton.infer("add_sub", inputs, client_timeout=CALL_TIMEOUT_S)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def assert_refused(triton: Any) -> None:
    with pytest.raises(InferenceServerException, match="UNAVAILABLE"):
        triton.is_server_live(client_timeout=CALL_TIMEOUT_S)


def negotiated_alpn(port: int, certs: Certificates) -> str | None:
    """The application protocol a TLS handshake offering h2 and http/1.1 settles on."""
    context = ssl.create_default_context(cafile=certs.ca)
    context.set_alpn_protocols(["h2", "http/1.1"])
    with socket.create_connection(("127.0.0.1", port), timeout=CALL_TIMEOUT_S) as raw:
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            return tls.selected_alpn_protocol()


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_tls_serves_tls_clients_and_refuses_plaintext(
    repo: Path, tmp_path: Path, certs: Certificates, frontend: str
) -> None:
    limits = tls_limits(certs, frontend)
    with serving(repo, tmp_path / "cache", limits, load_models=("add_sub",)) as server:
        # gRPC clients insist on ALPN "h2" over TLS.
        assert negotiated_alpn(server.port, certs) == "h2"
        with tls_client(server.address, certs) as triton:
            assert_infers(triton)
        with client(server.address) as plaintext:
            assert_refused(plaintext)
        # A client that does not trust the server's CA (the system's roots) is refused.
        with client(server.address, ssl=True) as untrusting:
            assert_refused(untrusting)


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_mutual_tls_serves_only_clients_with_a_trusted_certificate(
    repo: Path, tmp_path: Path, certs: Certificates, frontend: str
) -> None:
    limits = tls_limits(certs, frontend, mutual=True)
    with serving(repo, tmp_path / "cache", limits, load_models=("add_sub",)) as server:
        with tls_client(server.address, certs, "client") as trusted:
            assert_infers(trusted)
        with tls_client(server.address, certs) as anonymous:
            assert_refused(anonymous)
        with tls_client(server.address, certs, "stranger") as stranger:
            assert_refused(stranger)
        with client(server.address) as plaintext:
            assert_refused(plaintext)


def serve_settings(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> DataPlaneSettings:
    """The settings ``zeroserve serve argv`` would serve with (``run`` replaced, so that
    nothing is served)."""
    built: list[DataPlaneSettings] = []
    monkeypatch.setattr(data_plane.server, "run", built.append)
    assert main(["serve", *argv]) == 0
    [settings] = built
    return settings


def test_tritons_flags_reach_the_settings(
    repo: Path, certs: Certificates, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = [
        "--grpc-server-cert",
        str(certs.server_cert),
        "--grpc-server-key",
        str(certs.server_key),
    ]
    settings = serve_settings(
        ["--model-repository", str(repo), "--grpc-use-ssl=true", *files], monkeypatch
    )
    assert settings.grpc_use_ssl and not settings.grpc_use_ssl_mutual
    assert (settings.grpc_server_cert, settings.grpc_server_key) == (
        certs.server_cert,
        certs.server_key,
    )
    # As Triton's, --grpc-use-ssl-mutual implies --grpc-use-ssl.
    settings = serve_settings(
        [
            "--model-repository",
            str(repo),
            "--grpc-use-ssl-mutual",
            "true",
            "--grpc-root-cert",
            str(certs.ca),
            *files,
        ],
        monkeypatch,
    )
    assert settings.grpc_use_ssl and settings.grpc_use_ssl_mutual
    assert settings.grpc_root_cert == certs.ca


@pytest.mark.parametrize(
    ("flags", "status", "error"),
    [
        pytest.param(
            ["--grpc-use-ssl"],
            2,
            "grpc_use_ssl needs grpc_server_cert and grpc_server_key",
            id="no-files",
        ),
        pytest.param(
            [
                "--grpc-use-ssl",
                "--grpc-server-cert",
                "{server_cert}",
                "--grpc-server-key",
                "{missing}",
            ],
            3,
            "the gRPC server did not start: cannot read grpc_server_key {missing}: No such file",
            id="missing-key",
        ),
        pytest.param(
            [
                "--grpc-use-ssl",
                "--grpc-server-cert",
                "{server_cert}",
                "--grpc-server-key",
                "{client_key}",
            ],
            3,
            "grpc_server_key {client_key} and grpc_server_cert {server_cert} are not a usable key",
            id="key-of-another-certificate",
        ),
        pytest.param(
            [
                "--grpc-use-ssl-mutual",
                "--grpc-server-cert",
                "{server_cert}",
                "--grpc-server-key",
                "{server_key}",
            ],
            2,
            "grpc_use_ssl_mutual needs grpc_root_cert",
            id="mutual-without-root",
        ),
    ],
)
def test_serve_refuses_tls_it_cannot_serve(
    repo: Path,
    tmp_path: Path,
    certs: Certificates,
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    status: int,
    error: str,
) -> None:
    names = {
        "server_cert": certs.server_cert,
        "server_key": certs.server_key,
        "client_key": certs.client_key,
        "missing": tmp_path / "missing.key",
    }
    [grpc_port] = free_ports(1)
    argv = ["serve", "--model-repository", str(repo), "--grpc-port", str(grpc_port)]
    # Fails before anything is bound or loaded: nothing to stop.
    assert main([*argv, *(flag.format(**names) for flag in flags)]) == status
    stderr = capsys.readouterr().err
    assert error.format(**names) in stderr
    assert "Traceback" not in stderr
    assert certs.read("client_key").decode().splitlines()[1] not in stderr


@pytest.fixture
def stop_after() -> Iterator[list[Any]]:
    started: list[Any] = []
    yield started
    for server in started:
        server.stop(STOP_TIMEOUT_S)


@pytest.mark.integration
def test_zeroserve_serve_with_tritons_flags_serves_mutual_tls(
    repo: Path, tmp_path: Path, certs: Certificates, stop_after: list[Any]
) -> None:
    [grpc_port] = free_ports(1)
    server = start_server(
        repo,
        tmp_path,
        "--grpc-port",
        str(grpc_port),
        "--grpc-use-ssl-mutual=true",
        "--grpc-server-cert",
        str(certs.server_cert),
        "--grpc-server-key",
        str(certs.server_key),
        "--grpc-root-cert",
        str(certs.ca),
    )
    stop_after.append(server)
    address = f"localhost:{grpc_port}"  # the certificate's other name
    with tls_client(address, certs, "client") as triton:
        wait_model_ready(triton)
        assert_infers(triton)
    with tls_client(address, certs) as anonymous:
        assert_refused(anonymous)
    assert server.stop(STOP_TIMEOUT_S) == 0
    assert f"gRPC server listening on 127.0.0.1:{grpc_port}" in server.log()
    assert "(mutual TLS)" in server.log()


def wait_model_ready(triton: Any) -> None:
    """Until ``add_sub`` is ready (the gRPC listener starts after the HTTP one that
    ``start_server`` waited for)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        try:
            if triton.is_model_ready("add_sub", client_timeout=CALL_TIMEOUT_S):
                return
        except InferenceServerException:
            if time.monotonic() > deadline:
                raise
        assert time.monotonic() < deadline, "add_sub not ready in time"
        time.sleep(0.2)
