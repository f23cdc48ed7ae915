"""The access log of a live API process (both real services, tiny random model): one
`llmserve.access` line per request on the gRPC and the HTTP door (the latter driven by the
`openai` package), read back from the scheduler's log and parsed; and none under
--disable-log-requests."""

import re
import time
from pathlib import Path

import grpc
import pytest


from protos.llmserve.v1 import llmserve_pb2 as pb
from scheduler_svc.api.access_log import parse_line
from tests.integration.conftest import start_cluster

openai = pytest.importorskip("openai")

LINE = re.compile(r"^\S+ \S+ scheduler\[\d+\] ([A-Z]+) llmserve\.access: (.*)$", re.M)


def _start(model_dirs, tmp_path_factory, name, *flags):
    return start_cluster(tmp_path_factory, model_dirs["llama"], name, (), list(flags), http=True)


def _lines(cluster) -> list[tuple[str, dict]]:
    text = Path(cluster._logs[1].name).read_text()
    return [(level, parse_line(rest)) for level, rest in LINE.findall(text)]


def _wait_line(cluster, match, timeout=10.0) -> tuple[str, dict]:
    """The one access line whose fields satisfy `match` (written as the call ends)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [(level, f) for level, f in _lines(cluster) if match(f)]
        if found or time.monotonic() > deadline:
            assert len(found) == 1, (found, cluster.logs())
            return found[0]
        time.sleep(0.05)


@pytest.fixture(scope="module")
def cluster(model_dirs, tmp_path_factory):
    c = _start(model_dirs, tmp_path_factory, "access")
    yield c
    c.stop()


@pytest.fixture(scope="module")
def client(cluster):
    with openai.OpenAI(base_url=cluster.http_url + "/v1", api_key="-", max_retries=0, timeout=60) as c:
        yield c


def _generate(cluster, request_id, **params):
    return list(cluster.stub.Generate(pb.GenerateRequest(
        token_ids=pb.TokenIds(ids=[5, 6, 7, 8, 9]), request_id=request_id,
        params=pb.SamplingParams(**params)), timeout=60))


def test_grpc_generate_ok_and_refused(cluster):
    out = _generate(cluster, "acc-ok", max_tokens=7, ignore_eos=True)
    level, f = _wait_line(cluster, lambda f: f["request_id"] == "acc-ok")
    assert level == "INFO" and (f["door"], f["method"], f["status"], f["outcome"]) == \
        ("grpc", "Generate", "OK", "ok")
    usage = out[-1].total_usage
    assert (int(f["prompt_tokens"]), int(f["output_tokens"])) == (usage.prompt_tokens, 7)
    assert float(f["duration_ms"]) >= float(f["ttft_ms"]) > 0

    with pytest.raises(grpc.RpcError) as e:
        _generate(cluster, "acc-bad", max_tokens=7, temperature=-1.0)
    level, f = _wait_line(cluster, lambda f: f["request_id"] == "acc-bad")
    assert level == "INFO" and f["status"] == e.value.code().name == "INVALID_ARGUMENT"
    assert f["outcome"] == "refused" and f["message"] == e.value.details()
    assert "temperature" in f["message"]


def test_grpc_stream_cancelled_by_the_client(cluster):
    call = cluster.stub.Generate(pb.GenerateRequest(
        token_ids=pb.TokenIds(ids=[5, 6, 7]), request_id="acc-cancel",
        params=pb.SamplingParams(max_tokens=500, ignore_eos=True)))
    next(call)
    call.cancel()
    level, f = _wait_line(cluster, lambda f: f["request_id"] == "acc-cancel")
    assert level == "INFO" and (f["status"], f["outcome"]) == ("CANCELLED", "cancelled")
    assert 1 <= int(f["output_tokens"]) < 500


def test_http_completion_ok_and_refused(cluster, client):
    model = client.models.list().data[0].id
    r = client.completions.create(model=model, prompt="one two three", max_tokens=5,
                                  extra_body={"ignore_eos": True})
    level, f = _wait_line(cluster, lambda f: f["request_id"] == r.id)
    assert level == "INFO" and (f["door"], f["method"], f["status"], f["outcome"]) == \
        ("http", "POST /v1/completions", "200", "ok")
    assert (int(f["prompt_tokens"]), int(f["output_tokens"])) == \
        (r.usage.prompt_tokens, r.usage.completion_tokens) == (r.usage.prompt_tokens, 5)

    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model, prompt="hi", max_tokens=5, top_p=7.0)
    level, f = _wait_line(cluster, lambda f: f["door"] == "http" and f["status"] == "400")
    assert level == "INFO" and f["outcome"] == "refused"
    assert f["param"] == e.value.body["param"] == "top_p" and f["message"] == e.value.body["message"]


def test_http_stream_left_by_the_client_is_cancelled(cluster, client):
    model = client.models.list().data[0].id
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=400, stream=True,
        extra_body={"ignore_eos": True})
    first = next(iter(stream))
    stream.close()
    level, f = _wait_line(cluster, lambda f: f["request_id"] == first.id)
    assert level == "INFO" and (f["status"], f["outcome"]) == ("200", "cancelled")
    assert int(f["output_tokens"]) < 400


def test_disable_log_requests_leaves_no_access_line(model_dirs, tmp_path_factory):
    cluster = _start(model_dirs, tmp_path_factory, "no-access", "--disable-log-requests")
    try:
        _generate(cluster, "quiet", max_tokens=3, ignore_eos=True)
        with openai.OpenAI(base_url=cluster.http_url + "/v1", api_key="-", max_retries=0) as client:
            client.completions.create(prompt="one two", max_tokens=3, model=client.models.list().data[0].id)
            with pytest.raises(openai.BadRequestError):
                client.completions.create(prompt="hi", max_tokens=3, top_p=7.0, model="")
        cluster.wait_idle()
        time.sleep(0.3)
        text = Path(cluster._logs[1].name).read_text()
    finally:
        cluster.stop()
    assert "serving llmserve.v1.LLMServe" in text and "llmserve.access" not in text
