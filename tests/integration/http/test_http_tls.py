"""--ssl-certfile serves the HTTP API over HTTPS with the same files as the gRPC port."""

import json
import ssl
import time
import urllib.error
import urllib.request

import pytest

from benchmarks.cluster import free_port
from executor_svc.model_loader.random_model import build_random_model
from tests.integration.conftest import CPU_EXECUTOR
from tests.integration.reliability.test_tls_auth import TlsCluster, certs  # noqa: F401 (fixture)


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory, certs):  # noqa: F811
    model = build_random_model(tmp_path_factory.mktemp("https-model") / "llama", "tiny-llama", seed=0)
    port = free_port()
    c = TlsCluster(model, tmp_path_factory.mktemp("logs-https"), CPU_EXECUTOR,
                   ["--http-port", str(port), "--ssl-certfile", str(certs / "server.pem"),
                    "--ssl-keyfile", str(certs / "server.key")],
                   root_certificates=(certs / "ca.pem").read_bytes())
    c.https_url = f"https://127.0.0.1:{port}"
    c.ssl_context = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    yield c
    c.stop()


def _get(c, path, **kw):
    deadline = time.monotonic() + 30
    while True:
        try:
            return urllib.request.urlopen(c.https_url + path, timeout=10, **kw)
        except urllib.error.URLError as e:
            if isinstance(e.reason, ssl.SSLError) or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_https_serves_with_the_grpc_certificate(tls_cluster):
    with _get(tls_cluster, "/v1/models", context=tls_cluster.ssl_context) as r:
        assert r.status == 200 and json.loads(r.read())["data"][0]["id"]
    with pytest.raises(urllib.error.URLError):  # a client that does not trust the CA
        _get(tls_cluster, "/health", context=ssl.create_default_context())
