"""The tool-calling tests' clusters, one of each for the package, with tool calling on
(--enable-auto-tool-choice --tool-call-parser hermes): the chain model (its greedy output is
CALL_PIECES, whatever the chat) and the built-in SmolLM2-135M-Instruct. Each is told to stop as
its fixture ends and waited for last, so their shutdowns overlap."""

import json
import urllib.request

import pytest

from benchmarks.cluster import Cluster
from tests.integration.http.tools.chain_model import build_chain_model

TOOL_FLAGS = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
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
def builtin_cluster(_stopping, smollm2_gguf, smollm2_cache_dir, smollm2_folder, tmp_path_factory):
    """The built-in model, as --model the .gguf file (the session's conversion in --cache-dir)."""
    yield from _serve(_stopping, Cluster(
        smollm2_gguf, tmp_path_factory.mktemp("logs-smollm2-tools"),
        ["--device", "cpu", "--dtype", "float32", "--cache-dir", str(smollm2_cache_dir), "--num-kv-blocks", "128"],
        TOOL_FLAGS, http=True))


@pytest.fixture(scope="package")
def builtin(builtin_cluster):
    with _client(builtin_cluster) as client:
        yield client
