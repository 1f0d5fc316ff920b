"""The gRPC TLS settings (Triton's ``--grpc-use-ssl*`` flags as `GrpcLimits` fields, read
from each component's environment) and `load_server_tls`: what is missing or unusable is
refused with the setting and file named, and no message or repr carries the key."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pydantic
import pytest
from cryptography.hazmat.primitives import serialization

from activator.settings import ActivatorSettings
from data_plane.settings import DataPlaneSettings
from foundation.grpc_front.app import GrpcApp
from foundation.grpc_front.server import serve_grpc_front
from foundation.grpc_limits import GrpcLimits
from foundation.grpc_tls import ServerTls, load_server_tls
from foundation.serving import ServerStartError, bind_socket
from tests.certificates import Certificates, make_certificates


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


def tls(certs: Certificates, **fields: Any) -> GrpcLimits:
    values: dict[str, Any] = {
        "grpc_use_ssl": True,
        "grpc_server_cert": certs.server_cert,
        "grpc_server_key": certs.server_key,
    }
    values.update(fields)
    return GrpcLimits(**values)


def key_text(path: Path) -> list[str]:
    """The base64 lines of a PEM key, any of which a message must not carry."""
    return [line for line in path.read_text().splitlines() if not line.startswith("-----")]


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        pytest.param(
            {"grpc_use_ssl": True},
            "grpc_use_ssl needs grpc_server_cert and grpc_server_key",
            id="no-files",
        ),
        pytest.param(
            {"grpc_use_ssl": True, "grpc_server_cert": "c.pem"},
            "grpc_use_ssl needs grpc_server_key",
            id="no-key",
        ),
        pytest.param(
            {"grpc_use_ssl_mutual": True, "grpc_root_cert": "ca.pem"},
            "grpc_use_ssl_mutual needs grpc_use_ssl",
            id="mutual-without-ssl",
        ),
        pytest.param(
            {
                "grpc_use_ssl": True,
                "grpc_use_ssl_mutual": True,
                "grpc_server_cert": "c.pem",
                "grpc_server_key": "k.pem",
            },
            "grpc_use_ssl_mutual needs grpc_root_cert",
            id="mutual-without-root",
        ),
    ],
)
def test_incomplete_tls_settings_are_refused(fields: dict[str, Any], error: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=error):
        GrpcLimits(**fields)


@pytest.mark.parametrize("frontend", ["aio", "h2corn"])
def test_tls_is_off_by_default_and_on_either_front_end(certs: Certificates, frontend: str) -> None:
    assert load_server_tls(GrpcLimits()) is None
    # The files are read only with grpc_use_ssl on: a root alone changes nothing.
    assert load_server_tls(GrpcLimits(grpc_root_cert=Path("/nonexistent"))) is None
    loaded = load_server_tls(tls(certs, grpc_frontend=frontend))
    assert loaded is not None
    assert loaded.certificate == certs.read("server_cert")
    assert not loaded.requires_client_cert and loaded.root_certificates is None


def test_mutual_tls_loads_the_root_and_no_repr_shows_the_key(certs: Certificates) -> None:
    loaded = load_server_tls(tls(certs, grpc_use_ssl_mutual=True, grpc_root_cert=certs.ca))
    assert loaded is not None
    assert loaded.requires_client_cert
    assert loaded.root_certificates == certs.read("ca")
    assert loaded.private_key == certs.read("server_key")
    shown = repr(loaded)
    assert str(certs.server_key) in shown
    assert not any(line in shown for line in key_text(certs.server_key))


def test_each_components_environment_sets_tls(
    certs: Certificates, monkeypatch: pytest.MonkeyPatch
) -> None:
    for prefix in ("ZEROSERVE_DATA_PLANE_", "ZEROSERVE_ACTIVATOR_"):
        monkeypatch.setenv(f"{prefix}GRPC_USE_SSL", "true")
        monkeypatch.setenv(f"{prefix}GRPC_USE_SSL_MUTUAL", "1")
        monkeypatch.setenv(f"{prefix}GRPC_SERVER_CERT", str(certs.server_cert))
        monkeypatch.setenv(f"{prefix}GRPC_SERVER_KEY", str(certs.server_key))
        monkeypatch.setenv(f"{prefix}GRPC_ROOT_CERT", str(certs.ca))
    for settings in (DataPlaneSettings(model_repository="models"), ActivatorSettings()):
        assert settings.grpc_use_ssl and settings.grpc_use_ssl_mutual
        assert settings.grpc_root_cert == certs.ca
        assert load_server_tls(settings) is not None


def _encrypted(key: Path, to: Path) -> Path:
    private = serialization.load_pem_private_key(key.read_bytes(), None)
    to.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    return to


def _garbage(tmp_path: Path) -> Path:
    path = tmp_path / "garbage.pem"
    path.write_text("not a certificate\n")
    return path


_FileOf = Callable[[Certificates, Path], Path]


@pytest.mark.parametrize(
    ("field", "file_of", "error"),
    [
        pytest.param(
            "grpc_server_cert",
            lambda c, tmp: tmp / "missing.pem",
            "cannot read grpc_server_cert {path}: No such file",
            id="missing-cert",
        ),
        pytest.param(
            "grpc_server_cert",
            lambda c, tmp: tmp,
            "cannot read grpc_server_cert {path}: Is a directory",
            id="cert-is-a-folder",
        ),
        pytest.param(
            "grpc_server_cert",
            lambda c, tmp: _garbage(tmp),
            "grpc_server_cert {path} holds no usable PEM certificate",
            id="cert-not-pem",
        ),
        pytest.param(
            "grpc_server_cert",
            lambda c, tmp: c.server_key,
            "grpc_server_cert {path} holds no usable PEM certificate",
            id="key-as-cert",
        ),
        pytest.param(
            "grpc_server_key",
            lambda c, tmp: tmp / "missing.key",
            "cannot read grpc_server_key {path}: No such file",
            id="missing-key",
        ),
        pytest.param(
            "grpc_server_key",
            lambda c, tmp: c.server_cert,
            "grpc_server_key {path} holds no PEM private key",
            id="cert-as-key",
        ),
        pytest.param(
            "grpc_server_key",
            lambda c, tmp: _encrypted(c.server_key, tmp / "encrypted.key"),
            "grpc_server_key {path} is encrypted",
            id="encrypted-key",
        ),
        pytest.param(
            "grpc_server_key",
            lambda c, tmp: c.client_key,
            "grpc_server_key {path} and grpc_server_cert",
            id="key-of-another-certificate",
        ),
        pytest.param(
            "grpc_root_cert",
            lambda c, tmp: tmp / "missing-ca.pem",
            "cannot read grpc_root_cert {path}: No such file",
            id="missing-root",
        ),
        pytest.param(
            "grpc_root_cert",
            lambda c, tmp: _garbage(tmp),
            "grpc_root_cert {path} holds no usable PEM certificate",
            id="root-not-pem",
        ),
    ],
)
def test_unusable_files_fail_the_start_naming_setting_and_file(
    certs: Certificates, tmp_path: Path, field: str, file_of: _FileOf, error: str
) -> None:
    path = file_of(certs, tmp_path)
    fields = {"grpc_use_ssl_mutual": True, "grpc_root_cert": certs.ca, field: path}
    with pytest.raises(ServerStartError) as failed:
        load_server_tls(tls(certs, **fields))
    message = failed.value.message
    assert message.startswith("the gRPC server did not start: ")
    assert error.format(path=path) in message
    for key in (certs.server_key, certs.client_key):
        assert not any(line in message for line in key_text(key))


@pytest.mark.anyio
async def test_a_start_h2corn_refuses_is_a_server_start_error(certs: Certificates) -> None:
    # Files load_server_tls would refuse, handed to the front end directly: its own
    # refusal must come out as a failed start too, with the port released.
    mismatched = ServerTls(
        cert_path=certs.server_cert,
        key_path=certs.client_key,
        root_path=None,
        certificate=certs.read("server_cert"),
        private_key=certs.read("client_key"),
        root_certificates=None,
    )
    app = GrpcApp({}, max_receive_bytes=1024, max_send_bytes=1024, max_concurrent_rpcs=1)
    with bind_socket("127.0.0.1", 0) as sock:
        with pytest.raises(ServerStartError, match="the gRPC server did not start: h2corn: "):
            async with serve_grpc_front(
                app, sock, GrpcLimits(), drain_timeout_s=1.0, tls=mismatched
            ):
                pass
