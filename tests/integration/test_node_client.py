"""The Node.js example client (docs/examples/node/stream.mjs) against both real services: it
streams what a Python gRPC client gets for the same greedy request, sends the API key from
LLMSERVE_API_KEY, and reports a refused request with its gRPC status.

Needs `node` and the example's npm packages (`npm ci --prefix docs/examples/node`); skipped
without them."""

import json
import os
import shutil
import subprocess

import grpc
import pytest

from benchmarks.cluster import ROOT
from protos.llmserve.v1 import llmserve_pb2 as pb
from tests.integration.conftest import CPU_EXECUTOR, start_cluster
from tests.integration.reliability.test_tls_auth import TlsCluster, certs  # noqa: F401 (certs: a fixture)

EXAMPLE = ROOT / "docs" / "examples" / "node"
KEY = "node-client-test-key"
NODE = shutil.which("node")
MISSING = [p for p in ("@grpc/grpc-js", "@grpc/proto-loader") if not (EXAMPLE / "node_modules" / p).is_dir()]
pytestmark = [
    pytest.mark.skipif(NODE is None, reason="node is not installed"),
    pytest.mark.skipif(bool(MISSING), reason=f"the Node example's packages are not installed ({', '.join(MISSING)}): "
                                             "npm ci --prefix docs/examples/node"),
]


@pytest.fixture(scope="module")
def cluster(model_dirs, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:  # the key reaches the scheduler as an operator gives it
        mp.setenv("LLMSERVE_API_KEY", KEY)
        c = start_cluster(tmp_path_factory, model_dirs["llama"], "node")
    yield c
    c.stop()


def node(cluster, *args: str, key: str | None = KEY) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "LLMSERVE_API_KEY"}
    if key is not None:
        env["LLMSERVE_API_KEY"] = key
    return subprocess.run([NODE, str(EXAMPLE / "stream.mjs"), "--address", cluster.address, *args],
                          check=False, env=env, capture_output=True, text=True, timeout=60)


def python_stream(cluster, request: pb.GenerateRequest) -> list[pb.GenerateResponse]:
    return list(cluster.stub.Generate(request, metadata=[("authorization", f"Bearer {KEY}")], timeout=60))


def test_node_streams_what_python_gets(cluster):
    out = node(cluster, "The quick brown fox", "--max-tokens", "12", "--temperature", "0", "--json")
    assert out.returncode == 0, out.stderr + cluster.logs()
    messages = [json.loads(line) for line in out.stdout.splitlines()]
    expected = python_stream(cluster, pb.GenerateRequest(
        text="The quick brown fox", params=pb.SamplingParams(max_tokens=12, temperature=0)))
    # the same tokens (how they are split into messages depends on timing)
    assert [t for m in messages for t in m["token_ids"]] == [t for m in expected for t in m.token_ids]
    assert "".join(m["text"] for m in messages) == "".join(m.text for m in expected)
    last = messages[-1]
    assert last["finish_reason"] == "FINISH_REASON_LENGTH" == pb.FinishReason.Name(expected[-1].finish_reason)
    assert last["usage"] == {"prompt_tokens": expected[-1].usage.prompt_tokens, "completion_tokens": 12}
    assert all(m["finish_reason"] == "FINISH_REASON_UNSPECIFIED" for m in messages[:-1])


def test_node_prints_the_text_and_the_finish_line(cluster):
    out = node(cluster, "Hello", "--max-tokens", "5")
    assert out.returncode == 0, out.stderr
    text = "".join(m.text for m in python_stream(cluster, pb.GenerateRequest(
        text="Hello", params=pb.SamplingParams(max_tokens=5, temperature=0))))
    prompt_tokens = len(cluster.stub.Tokenize(pb.TokenizeRequest(text="Hello"), timeout=10,
                                              metadata=[("authorization", f"Bearer {KEY}")]).token_ids)
    assert out.stdout == f"{text}\n[FINISH_REASON_LENGTH: {prompt_tokens} prompt + 5 generated tokens]\n"


def test_node_chat_and_seeded_sampling_match_python(cluster):
    out = node(cluster, "Hi", "--chat", "--max-tokens", "6", "--temperature", "1", "--seed", "1234", "--json")
    assert out.returncode == 0, out.stderr
    chat = pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="Hi")])
    expected = python_stream(cluster, pb.GenerateRequest(
        chat=chat, params=pb.SamplingParams(max_tokens=6, temperature=1, seed=1234)))
    got = [t for line in out.stdout.splitlines() for t in json.loads(line)["token_ids"]]
    assert got == [t for m in expected for t in m.token_ids] and len(got) == 6


@pytest.mark.parametrize("args, key, status", [
    (["--max-tokens", "0"], KEY, grpc.StatusCode.INVALID_ARGUMENT),  # max_tokens must be at least 1
    (["--temperature=-1"], KEY, grpc.StatusCode.INVALID_ARGUMENT),
    ([], None, grpc.StatusCode.UNAUTHENTICATED),
    ([], "wrong-key", grpc.StatusCode.UNAUTHENTICATED),
])
def test_node_reports_the_grpc_status_of_a_refused_call(cluster, args, key, status):
    out = node(cluster, "Hello", *args, key=key)
    assert out.returncode == 1 and out.stdout == ""
    name, code = status.name, status.value[0]
    assert out.stderr.startswith(f"error: {name} ({code}): "), out.stderr
    assert len(out.stderr.strip()) > len(f"error: {name} ({code}): ") + 5  # the server's reason too


def test_node_cannot_reach_a_server_that_is_not_there(cluster):
    from benchmarks.cluster import free_port

    out = subprocess.run([NODE, str(EXAMPLE / "stream.mjs"), "--address", f"127.0.0.1:{free_port()}",
                          "--timeout", "5"], check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and out.stderr.startswith("error: UNAVAILABLE (14): "), out.stderr


def test_node_over_tls_with_a_ca_bundle(model_dirs, tmp_path, certs):  # noqa: F811
    tls = TlsCluster(model_dirs["llama"], tmp_path / "logs", CPU_EXECUTOR,
                     ["--ssl-certfile", str(certs / "server.pem"), "--ssl-keyfile", str(certs / "server.key")],
                     root_certificates=(certs / "ca.pem").read_bytes())
    try:
        out = node(tls, "Hello", "--max-tokens", "4", "--json", "--ca-cert", str(certs / "ca.pem"), key=None)
        assert out.returncode == 0, out.stderr
        expected = list(tls.stub.Generate(pb.GenerateRequest(
            text="Hello", params=pb.SamplingParams(max_tokens=4, temperature=0)), timeout=60))
        got = [t for line in out.stdout.splitlines() for t in json.loads(line)["token_ids"]]
        assert got == [t for m in expected for t in m.token_ids] and len(got) == 4
        plain = node(tls, "Hello", "--max-tokens", "4", "--timeout", "5", key=None)  # no TLS: refused
        assert plain.returncode == 1 and plain.stderr.startswith("error: UNAVAILABLE (14): "), plain.stderr
    finally:
        tls.stop()
