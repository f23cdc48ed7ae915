"""The tool-calling tests' clusters, with tool calling on (--enable-auto-tool-choice
--tool-call-parser hermes): the chain model's, one for the package (its greedy output is
CALL_PIECES, whatever the chat; told to stop as its fixture ends and waited for last), and the
built-in SmolLM2-135M-Instruct's, which tests/integration/conftest.py starts for the real-model
and structured-output tests too."""

import json
import urllib.request

import pytest

from benchmarks.cluster import Cluster
from tests.integration.conftest import TOOL_FLAGS
from tests.integration.http.tools.chain_model import build_chain_model

# What the chain model writes: content, then two hermes calls, cut where a parser must hold back.
CALL_PIECES = ["I will check.", "\n<tool", "_call>\n{\"name\": \"get_", "weather\", \"arguments\": {\"ci",
               "ty\": \"Paris\", \"days\": [1, ", "2]}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", ",
               "\"arguments\": {\"tz\": \"Europe/Paris\"}}\n</tool_call>"]


def detokenize(cluster, token_ids: list[int]) -> str:
    request = urllib.request.Request(cluster.http_url + "/detokenize", data=json.dumps({"tokens": token_ids, "skip_special_tokens": False}).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())["prompt"]


def _client(cluster):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=cluster.http_url + "/v1", api_key="none", max_retries=0, timeout=60)


@pytest.fixture(scope="package")
def _stopping():
    """Clusters told to stop (SIGTERM), waited for when the package ends."""
    clusters = []
    yield clusters
    for c in clusters:
        c.stop()


def _serve(stopping: list, cluster: Cluster):
    try:
        yield cluster
    finally:
        for p in cluster.procs:
            p.terminate()
        stopping.append(cluster)


@pytest.fixture(scope="package")
def chain_cluster(_stopping, tmp_path_factory):
    model = build_chain_model(tmp_path_factory.mktemp("chain-model") / "llama", CALL_PIECES)
    yield from _serve(_stopping, Cluster(model, tmp_path_factory.mktemp("logs-chain"), ["--device", "cpu"],
                                         TOOL_FLAGS, http=True))


@pytest.fixture(scope="package")
def chain(chain_cluster):
    with _client(chain_cluster) as client:
        yield client


@pytest.fixture(scope="package")
def builtin_cluster(smollm2_cluster):
    """The built-in model: tests/integration/conftest.py's cluster (tool calling on), shared."""
    return smollm2_cluster


@pytest.fixture(scope="package")
def builtin(builtin_cluster):
    with _client(builtin_cluster) as client:
        yield client
