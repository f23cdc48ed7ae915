"""The cluster of the OpenAI-compatible HTTP tests: both real services on a tiny random model,
with an API key and /tokenizer_info; one for the package (every test file here shares it)."""

import time

import pytest

from benchmarks.cluster import Cluster
from executor_svc.model_loader.random_model import build_random_model
from protos.llmserve.v1 import llmserve_pb2 as pb
from tests.integration.conftest import CPU_EXECUTOR

API_KEY = "test-http-key"
AUTH = (("authorization", f"Bearer {API_KEY}"),)


@pytest.fixture(scope="package")
def model_folder(tmp_path_factory):
    return build_random_model(tmp_path_factory.mktemp("http-model") / "llama", "tiny-llama", seed=0)


@pytest.fixture(scope="package")
def cluster(model_folder, tmp_path_factory):
    c = Cluster(model_folder, tmp_path_factory.mktemp("logs-http"), CPU_EXECUTOR,
                ["--api-key", API_KEY, "--enable-tokenizer-info-endpoint"], http=True)
    yield c
    c.stop()


@pytest.fixture(scope="package")
def client(cluster):
    openai = pytest.importorskip("openai")
    with openai.OpenAI(base_url=cluster.http_url + "/v1", api_key=API_KEY, max_retries=0,
                       timeout=60) as c:
        yield c


@pytest.fixture(scope="package")
def model_name(client):
    return client.models.list().data[0].id


def wait_until_idle(cluster, why: str, timeout_s: float = 10.0) -> None:
    """Until the engine runs and queues nothing (GetServerStatus); fails with `why` past timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        s = cluster.stub.GetServerStatus(pb.GetServerStatusRequest(), timeout=10, metadata=AUTH)
        if s.num_running == 0 and s.num_waiting == 0:
            return
        assert time.monotonic() < deadline, why
        time.sleep(0.05)
