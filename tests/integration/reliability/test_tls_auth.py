"""TLS and the API key on the public port, with certificates made here (a CA, a server
certificate for 127.0.0.1 and a client certificate it signed).

End to end: a real cluster with --ssl-certfile/--ssl-keyfile and --api-key (from the environment
variable LLMSERVE_API_KEY). Mutual TLS (--ssl-ca-certs) on a small server built from the same
credentials function the scheduler uses.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import subprocess
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from benchmarks.cluster import Cluster, free_port
from protos.llmserve.v1 import llmserve_pb2 as pb
from protos.llmserve.v1 import llmserve_pb2_grpc as pb_grpc
from scheduler_svc.api.grpc.security import server_credentials
from tests.integration.conftest import CPU_EXECUTOR

API_KEY = "s3cret-key-for-tests"


def _certs_with_cryptography(folder: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def write(name, key, cert):
        (folder / f"{name}.key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        (folder / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def issue(cn, issuer_name, issuer_key, key, is_ca=False, san=None):
        b = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
             .issuer_name(issuer_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(minutes=5))
             .not_valid_after(now + datetime.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True))
        if san:
            b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return b.sign(issuer_key, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "llmserve test CA")])
    write("ca", ca_key, issue("llmserve test CA", ca_name, ca_key, ca_key, is_ca=True))
    for name, san in [("server", [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                      ("client", None)]:
        key = ec.generate_private_key(ec.SECP256R1())
        write(name, key, issue(name, ca_name, ca_key, key, san=san))


def _certs_with_openssl(folder: Path) -> None:
    def run(*args):
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
        "-subj", "/CN=llmserve test CA", "-keyout", "ca.key", "-out", "ca.pem")
    (folder / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for name in ("server", "client"):
        run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", f"/CN={name}",
            "-keyout", f"{name}.key", "-out", f"{name}.csr")
        ext = ["-extfile", "san.ext"] if name == "server" else []
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "1", "-out", f"{name}.pem", *ext)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("certs")
    try:
        _certs_with_cryptography(folder)
    except ImportError:
        if shutil.which("openssl") is None:
            pytest.skip("neither the cryptography package nor openssl is available")
        _certs_with_openssl(folder)
    return folder


class TlsCluster(Cluster):
    """A Cluster whose scheduler serves TLS: its own channel trusts the test CA."""

    def __init__(self, *args, root_certificates: bytes, **kwargs):
        self._root_certificates = root_certificates
        super().__init__(*args, **kwargs)

    def _wait_serving(self, timeout: float) -> None:
        self.channel.close()
        self.channel = grpc.secure_channel(self.address, grpc.ssl_channel_credentials(self._root_certificates))
        self.stub = pb_grpc.LLMServeStub(self.channel)
        super()._wait_serving(timeout)


@pytest.fixture(scope="module")
def cluster(model_dirs, tmp_path_factory, certs):
    os.environ["LLMSERVE_API_KEY"] = API_KEY  # read by the scheduler process (as vLLM reads VLLM_API_KEY)
    try:
        c = TlsCluster(model_dirs["llama"], tmp_path_factory.mktemp("logs-tls"), CPU_EXECUTOR,
                       ["--ssl-certfile", str(certs / "server.pem"), "--ssl-keyfile", str(certs / "server.key")],
                       root_certificates=(certs / "ca.pem").read_bytes())
    finally:
        del os.environ["LLMSERVE_API_KEY"]
    yield c
    c.stop()


REQUEST = pb.GenerateRequest(token_ids=pb.TokenIds(ids=[5, 9, 11]),
                             params=pb.SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True))


def _bearer(key: str):
    return (("authorization", f"Bearer {key}"),)


def test_tls_with_the_right_key_serves_tokens(cluster):
    messages = list(cluster.stub.Generate(REQUEST, metadata=_bearer(API_KEY), timeout=60))
    assert sum(len(m.token_ids) for m in messages) == 5
    assert messages[-1].finish_reason == pb.FINISH_REASON_LENGTH
    assert cluster.stub.GetModelInfo(pb.GetModelInfoRequest(), metadata=_bearer(API_KEY), timeout=10).vocab_size == 512


@pytest.mark.parametrize("metadata", [(), _bearer("wrong-key"), _bearer(API_KEY + "x"), _bearer(""),
                                      (("authorization", API_KEY),), (("authorization", f"Basic {API_KEY}"),)],
                         ids=["none", "wrong", "longer", "empty", "no scheme", "basic"])
def test_without_the_right_key_every_rpc_is_unauthenticated(cluster, metadata):
    for call in [lambda: list(cluster.stub.Generate(REQUEST, metadata=metadata, timeout=10)),
                 lambda: cluster.stub.GetServerStatus(pb.GetServerStatusRequest(), metadata=metadata, timeout=10)]:
        with pytest.raises(grpc.RpcError) as err:
            call()
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "authorization: Bearer" in err.value.details()


def test_health_is_open_and_reflection_is_not(cluster):
    status = health_pb2_grpc.HealthStub(cluster.channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert status.status == health_pb2.HealthCheckResponse.SERVING
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    stub = reflection_pb2_grpc.ServerReflectionStub(cluster.channel)
    ask = reflection_pb2.ServerReflectionRequest(list_services="")
    with pytest.raises(grpc.RpcError) as err:
        list(stub.ServerReflectionInfo(iter([ask]), timeout=10))
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    names = {s.name for r in stub.ServerReflectionInfo(iter([ask]), metadata=_bearer(API_KEY), timeout=10)
             for s in r.list_services_response.service}
    assert "llmserve.v1.LLMServe" in names


def test_plaintext_client_is_refused(cluster):
    with grpc.insecure_channel(cluster.address) as channel:
        with pytest.raises(grpc.RpcError) as err:
            list(pb_grpc.LLMServeStub(channel).Generate(REQUEST, metadata=_bearer(API_KEY), timeout=5))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_needs_a_client_certificate(certs):
    """--ssl-ca-certs: server_credentials asks every client for a certificate the CA signed."""
    server = grpc.server(futures.ThreadPoolExecutor(2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = free_port()
    credentials = server_credentials(str(certs / "server.pem"), str(certs / "server.key"), str(certs / "ca.pem"))
    assert server.add_secure_port(f"127.0.0.1:{port}", credentials) == port
    server.start()
    ca, check = (certs / "ca.pem").read_bytes(), health_pb2.HealthCheckRequest()
    try:
        without = grpc.ssl_channel_credentials(ca)
        with_cert = grpc.ssl_channel_credentials(ca, (certs / "client.key").read_bytes(),
                                                 (certs / "client.pem").read_bytes())
        with grpc.secure_channel(f"127.0.0.1:{port}", without) as channel:
            with pytest.raises(grpc.RpcError) as err:
                health_pb2_grpc.HealthStub(channel).Check(check, timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        with grpc.secure_channel(f"127.0.0.1:{port}", with_cert) as channel:
            assert health_pb2_grpc.HealthStub(channel).Check(check, timeout=5).status == \
                health_pb2.HealthCheckResponse.SERVING
    finally:
        server.stop(None)


def test_tls_flags_are_checked_before_anything_starts(certs):
    for args, needle in [((str(certs / "server.pem"), "", ""), "both"),
                         (("", "", str(certs / "ca.pem")), "--ssl-ca-certs needs"),
                         ((str(certs / "missing.pem"), str(certs / "server.key"), ""), "cannot read")]:
        with pytest.raises(SystemExit) as err:
            server_credentials(*args)
        assert needle in str(err.value)


def test_launcher_says_how_to_turn_both_on():
    from llmserve.launcher import build_parser, security_hint

    plain = security_hint(build_parser().parse_args([]), {})
    assert "LLMSERVE_API_KEY=<key>" in plain and "--ssl-certfile" in plain
    keyed = security_hint(build_parser().parse_args([]), {"LLMSERVE_API_KEY": "k"})
    assert "LLMSERVE_API_KEY" not in keyed and "--ssl-certfile" in keyed
    both = build_parser().parse_args(["--scheduler-args", "--api-key k --ssl-certfile c --ssl-keyfile k"])
    assert security_hint(both, {}) == ""
