"""gRPC over TLS and mutual TLS against real Triton 2.51: Triton and ``zeroserve serve`` (on
each front end) started with the same certificate and key (and root, for mutual TLS) and
Triton's own flags serve the same answers to ``tritonclient.grpc`` with ``ssl=True``, and
refuse the same clients (plaintext, trusting another CA, and with mutual TLS no client
certificate or one from another CA) with the same status code, and the same details (the
server's address aside) except where :data:`DIFFERENT_DETAILS` says how and why. Skips,
saying why, where Triton cannot run."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

from foundation.proto import grpc_service_pb2 as pb  # noqa: E402
from tests.certificates import Certificates, make_certificates  # noqa: E402
from tests.data_plane.grpc.differential import Outcome, call  # noqa: E402
from tests.integration.conftest import ServerProcess, start_server  # noqa: E402
from tests.models import make_config  # noqa: E402
from tests.triton_oracle import (  # noqa: E402
    ADD_SUB_MODEL,
    free_ports,
    triton_for,
    write_python_backend_model,
)

pytestmark = pytest.mark.integration

MODEL = "add_sub"
FRONTENDS = ("h2corn", "aio")
CALL_TIMEOUT_S = 30.0
"""A refused client fails at once; this only bounds a server that would hang it."""
READY_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A CA that signed neither server's certificate."""
    return make_certificates(tmp_path_factory.mktemp("other-certs")).read("ca")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``add_sub`` (FP32 [4], batching up to 8) as a Python-backend model both serve."""
    path = tmp_path_factory.mktemp("repo")
    config = make_config(
        MODEL,
        backend="python",
        inputs=[("INPUT0", "FP32", (4,)), ("INPUT1", "FP32", (4,))],
        outputs=[("OUTPUT0", "FP32", (4,)), ("OUTPUT1", "FP32", (4,))],
    )
    write_python_backend_model(path, config, ADD_SUB_MODEL)
    return path


def tls_flags(certs: Certificates, mutual: bool) -> list[str]:
    """Triton's flags, as Triton spells them (zeroserve takes the same)."""
    flags = [
        f"--grpc-server-cert={certs.server_cert}",
        f"--grpc-server-key={certs.server_key}",
    ]
    if mutual:
        return ["--grpc-use-ssl-mutual=true", f"--grpc-root-cert={certs.ca}", *flags]
    return ["--grpc-use-ssl=true", *flags]


@dataclass(frozen=True)
class Servers:
    """The servers of one mode, by name (Triton first, then zeroserve on each front end),
    all serving ``certs``' server certificate."""

    certs: Certificates
    mutual: bool
    addresses: dict[str, str]

    def tls_client(self, address: str) -> Any:
        """tritonclient over TLS trusting the CA, presenting the CA's client certificate
        where the servers ask for one."""
        options: dict[str, Any] = {"ssl": True, "root_certificates": str(self.certs.ca)}
        if self.mutual:
            options["certificate_chain"] = str(self.certs.client_cert)
            options["private_key"] = str(self.certs.client_key)
        return grpcclient.InferenceServerClient(address, **options)


@pytest.fixture(scope="module", params=["tls", "mutual"])
def servers(
    request: pytest.FixtureRequest,
    repo: Path,
    certs: Certificates,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Servers]:
    mutual = request.param == "mutual"
    flags = tls_flags(certs, mutual)
    with triton_for(repo, tmp_path_factory.mktemp("triton-log"), *flags) as triton:
        addresses = {"triton": triton.grpc_address}
        started: list[ServerProcess] = []
        try:
            for frontend in FRONTENDS:
                [grpc_port] = free_ports(1)
                started.append(
                    start_server(
                        repo,
                        tmp_path_factory.mktemp(f"zeroserve-{frontend}-log"),
                        f"--grpc-port={grpc_port}",
                        f"--grpc-frontend={frontend}",
                        *flags,
                    )
                )
                addresses[f"zeroserve-{frontend}"] = f"127.0.0.1:{grpc_port}"
            servers = Servers(certs, mutual, addresses)
            for address in addresses.values():
                with servers.tls_client(address) as client:
                    wait_model_ready(client)
            yield servers
        finally:
            for server in started:
                server.stop()


def wait_model_ready(client: Any) -> None:
    """Until the model is ready (zeroserve's gRPC listener starts after the HTTP one its
    start waited for)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        try:
            if client.is_model_ready(MODEL, client_timeout=CALL_TIMEOUT_S):
                return
        except InferenceServerException:
            if time.monotonic() > deadline:
                raise
        assert time.monotonic() < deadline, f"{MODEL} not ready in time"
        time.sleep(0.2)


def infer(client: Any) -> dict[str, np.ndarray]:
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    b = np.full((1, 4), 10.0, dtype=np.float32)
    inputs = [grpcclient.InferInput(n, [1, 4], "FP32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer(MODEL, inputs, client_timeout=CALL_TIMEOUT_S)
    return {name: result.as_numpy(name) for name in ("OUTPUT0", "OUTPUT1")}


def test_a_trusted_tls_client_is_served_the_same(servers: Servers) -> None:
    answers = {}
    for name, address in servers.addresses.items():
        with servers.tls_client(address) as client:
            assert client.is_server_live(client_timeout=CALL_TIMEOUT_S), name
            assert client.is_server_ready(client_timeout=CALL_TIMEOUT_S), name
            metadata = client.get_server_metadata(client_timeout=CALL_TIMEOUT_S)
            assert metadata.name and metadata.version, name
            answers[name] = (
                infer(client),
                client.get_model_metadata(MODEL, as_json=True, client_timeout=CALL_TIMEOUT_S),
            )
    (outputs, model_metadata) = answers.pop("triton")
    np.testing.assert_array_equal(outputs["OUTPUT0"], [np.arange(4) + 10.0])
    np.testing.assert_array_equal(outputs["OUTPUT1"], [np.arange(4) - 10.0])
    for name, (their_outputs, their_metadata) in answers.items():
        for output, values in outputs.items():
            np.testing.assert_array_equal(their_outputs[output], values, err_msg=name)
        assert their_metadata == model_metadata, name


CLIENTS = ["plaintext", "other-ca", "no-client-cert", "other-ca-client-cert"]
"""Trusting the servers' CA unless ``other-ca``; the last two are refused only with mutual
TLS (and served otherwise, by Triton as by zeroserve)."""

DIFFERENT_DETAILS = {
    # Triton's OpenSSL builds its chain from the --grpc-root-cert store and so sends the
    # CA after the server's certificate; zeroserve sends the certificate file as it is.
    ("mutual", "other-ca", "zeroserve-h2corn"): (
        "self signed certificate in certificate chain",
        "unable to get local issuer certificate",
    ),
    ("mutual", "other-ca", "zeroserve-aio"): (
        "self signed certificate in certificate chain",
        "unable to get local issuer certificate",
    ),
    # Refusing a client certificate after the TLS 1.3 handshake, Triton (as grpc.aio) closes
    # the connection; h2corn's rustls sends an alert first, which the client cannot unwrap.
    ("mutual", "no-client-cert", "zeroserve-h2corn"): (
        "Socket closed",
        "Unwrap failed (TSI_DATA_CORRUPTED)",
    ),
    ("mutual", "other-ca-client-cert", "zeroserve-h2corn"): (
        "Socket closed",
        "Unwrap failed (TSI_DATA_CORRUPTED)",
    ),
}
"""Where the client's details differ (the code never does): (Triton's, zeroserve's), each a
part of the details that only that server's refusal gives."""


def credentials(client: str, certs: Certificates, other_ca: bytes) -> grpc.ChannelCredentials:
    """The TLS credentials of ``client`` (not plaintext)."""
    if client == "other-ca":
        return grpc.ssl_channel_credentials(root_certificates=other_ca)
    if client == "no-client-cert":
        return grpc.ssl_channel_credentials(root_certificates=certs.read("ca"))
    return grpc.ssl_channel_credentials(
        root_certificates=certs.read("ca"),
        private_key=certs.read("stranger_key"),
        certificate_chain=certs.read("stranger_cert"),
    )


def live(address: str, client: str, certs: Certificates, other_ca: bytes) -> Outcome:
    """ServerLive from ``client`` on a channel of its own, its address replaced by
    ``ADDRESS`` in the details."""
    if client == "plaintext":
        channel = grpc.insecure_channel(address)
    else:
        channel = grpc.secure_channel(address, credentials(client, certs, other_ca))
    with channel:
        outcome = call(channel, "ServerLive", pb.ServerLiveRequest(), pb.ServerLiveResponse)
    return Outcome(outcome.code, outcome.details.replace(address, "ADDRESS"))


@pytest.mark.parametrize("client", CLIENTS)
def test_clients_are_refused_as_triton_refuses_them(
    servers: Servers, certs: Certificates, other_ca: bytes, client: str
) -> None:
    outcomes = {
        name: live(address, client, certs, other_ca) for name, address in servers.addresses.items()
    }
    expected = outcomes.pop("triton")
    mode = "mutual" if servers.mutual else "tls"
    served = client in ("no-client-cert", "other-ca-client-cert") and not servers.mutual
    assert (expected.code == "OK") == served, expected
    for name, outcome in outcomes.items():
        assert outcome.code == expected.code, (name, expected, outcome)
        difference = DIFFERENT_DETAILS.get((mode, client, name))
        if difference is None:
            assert outcome.details == expected.details, (name, expected, outcome)
        else:
            tritons, zeroserves = difference
            assert tritons in expected.details and tritons not in outcome.details, expected
            assert zeroserves in outcome.details and zeroserves not in expected.details, outcome
