"""Certificates made at test time for the TLS tests: a CA, a server certificate for
127.0.0.1 and localhost, and a client certificate, all signed by the CA (P-256 keys,
valid for a day), written as PEM files."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALID = datetime.timedelta(days=1)


@dataclass(frozen=True)
class Certificates:
    """PEM files: ``ca`` signed ``server_cert`` (SAN 127.0.0.1, localhost) and
    ``client_cert``; ``other_ca`` signed ``stranger_cert``, a client the server does not
    trust."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path
    stranger_key: Path

    def read(self, name: str) -> bytes:
        """The bytes of the file ``name`` (a field name)."""
        path: Path = getattr(self, name)
        return path.read_bytes()


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALID)
    )


def _authority(common_name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(common_name)
    certificate = (
        _builder(name, name, key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return certificate, key


def _leaf(
    authority: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
    common_name: str,
    names: list[x509.GeneralName],
    usage: x509.ObjectIdentifier,
) -> tuple[bytes, bytes]:
    ca_certificate, ca_key = authority
    key = ec.generate_private_key(ec.SECP256R1())
    certificate = (
        _builder(_name(common_name), ca_certificate.subject, key)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return certificate.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def make_certificates(folder: Path) -> Certificates:
    """Generate the certificates into ``folder`` (created)."""
    folder.mkdir(parents=True, exist_ok=True)
    authority = _authority("zeroserve test CA")
    server = _leaf(
        authority,
        "zeroserve test server",
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
        ExtendedKeyUsageOID.SERVER_AUTH,
    )
    client = _leaf(
        authority, "test client", [x509.DNSName("client")], ExtendedKeyUsageOID.CLIENT_AUTH
    )
    stranger = _leaf(
        _authority("another CA"),
        "stranger",
        [x509.DNSName("stranger")],
        ExtendedKeyUsageOID.CLIENT_AUTH,
    )
    files = Certificates(
        ca=folder / "ca.pem",
        server_cert=folder / "server.pem",
        server_key=folder / "server.key",
        client_cert=folder / "client.pem",
        client_key=folder / "client.key",
        stranger_cert=folder / "stranger.pem",
        stranger_key=folder / "stranger.key",
    )
    files.ca.write_bytes(authority[0].public_bytes(serialization.Encoding.PEM))
    for (cert_path, key_path), (cert, key) in (
        ((files.server_cert, files.server_key), server),
        ((files.client_cert, files.client_key), client),
        ((files.stranger_cert, files.stranger_key), stranger),
    ):
        cert_path.write_bytes(cert)
        key_path.write_bytes(key)
    return files
