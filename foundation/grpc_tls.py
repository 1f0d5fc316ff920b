"""TLS for a zeroserve gRPC server: the PEM files `GrpcLimits` names (Triton's
``--grpc-use-ssl``, ``--grpc-use-ssl-mutual``, ``--grpc-server-cert``, ``--grpc-server-key``,
``--grpc-root-cert``), read and checked once as the server starts, for either front end.

Both front ends would otherwise find a bad file late and say little: grpc.aio answers any
unusable certificate or key with "Failed to bind to address", and h2corn fails inside its
start. Checking here first (with the standard library's OpenSSL) names the setting, the
file and what is wrong with it. No message carries the files' contents.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import grpc

from foundation.grpc_limits import GrpcLimits
from foundation.serving import ServerStartError

__all__ = ["ServerTls", "load_server_tls", "server_credentials"]

_SERVER: Final = "gRPC"


@dataclass(frozen=True)
class ServerTls:
    """A gRPC server's checked TLS identity: its certificate chain and private key and,
    with mutual TLS, the certificates clients' certificates must chain to. The paths are
    kept for front ends that read the files themselves (h2corn); the key's bytes never
    appear in ``repr``."""

    cert_path: Path
    key_path: Path
    root_path: Path | None
    """Set only with mutual TLS."""
    certificate: bytes = field(repr=False)
    private_key: bytes = field(repr=False)
    root_certificates: bytes | None = field(repr=False)

    @property
    def requires_client_cert(self) -> bool:
        """Whether a client must present a certificate chaining to ``root_path``."""
        return self.root_path is not None

    @property
    def mode(self) -> str:
        """``TLS`` or ``mutual TLS``, for logs."""
        return "mutual TLS" if self.requires_client_cert else "TLS"


def load_server_tls(limits: GrpcLimits) -> ServerTls | None:
    """The TLS ``limits`` asks for, its files read and checked; None when
    ``grpc_use_ssl`` is off. Raises ServerStartError naming the setting and the file when
    one cannot be read, holds no PEM certificate (or key), holds an encrypted key, or
    when the key does not belong to the certificate."""
    if not limits.grpc_use_ssl:
        return None
    # The settings' validators make these present with grpc_use_ssl (and the root with
    # mutual TLS).
    assert limits.grpc_server_cert is not None and limits.grpc_server_key is not None
    cert_path, key_path = limits.grpc_server_cert, limits.grpc_server_key
    certificate = _read("grpc_server_cert", cert_path)
    _check_certificates("grpc_server_cert", cert_path, certificate)
    private_key = _read("grpc_server_key", key_path)
    _check_key(key_path, private_key)
    _check_pair(cert_path, key_path)
    root_path = root_certificates = None
    if limits.grpc_use_ssl_mutual:
        assert limits.grpc_root_cert is not None
        root_path = limits.grpc_root_cert
        root_certificates = _read("grpc_root_cert", root_path)
        _check_certificates("grpc_root_cert", root_path, root_certificates)
    return ServerTls(
        cert_path=cert_path,
        key_path=key_path,
        root_path=root_path,
        certificate=certificate,
        private_key=private_key,
        root_certificates=root_certificates,
    )


def server_credentials(tls: ServerTls) -> grpc.ServerCredentials:
    """grpc.aio's credentials for a port serving ``tls``."""
    return grpc.ssl_server_credentials(
        [(tls.private_key, tls.certificate)],
        root_certificates=tls.root_certificates,
        require_client_auth=tls.requires_client_cert,
    )


def _fail(reason: str) -> ServerStartError:
    return ServerStartError(server=_SERVER, reason=reason)


def _read(setting: str, path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise _fail(f"cannot read {setting} {path}: {exc.strerror}") from None


def _check_certificates(setting: str, path: Path, pem: bytes) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_verify_locations(cadata=pem.decode("ascii"))
    except (UnicodeDecodeError, ssl.SSLError) as exc:
        raise _fail(f"{setting} {path} holds no usable PEM certificate ({exc})") from None


def _check_key(path: Path, pem: bytes) -> None:
    # Neither grpc.aio nor h2corn takes a passphrase, and OpenSSL would prompt for one on
    # the terminal: an encrypted key is refused before it gets there.
    if b"ENCRYPTED" in pem:
        raise _fail(
            f"grpc_server_key {path} is encrypted; gRPC servers take only an unencrypted "
            "PEM key (decrypt it, e.g. `openssl pkey -in KEY -out KEY.plain`)"
        )
    if b"PRIVATE KEY-----" not in pem:
        raise _fail(f"grpc_server_key {path} holds no PEM private key")


def _check_pair(cert_path: Path, key_path: Path) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert_path, key_path, password=_no_passphrase)
    except (ssl.SSLError, ValueError) as exc:
        raise _fail(
            f"grpc_server_key {key_path} and grpc_server_cert {cert_path} are not a usable "
            f"key and certificate pair ({exc})"
        ) from None


def _no_passphrase() -> bytes:
    raise ValueError("the key asks for a passphrase")
