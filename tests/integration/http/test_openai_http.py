"""The OpenAI-compatible HTTP API (--http-port) of both real services on a tiny random model,
driven with the official `openai` package; compared with the gRPC API on the same engine."""

import json
import socket
import time
import urllib.error
import urllib.request

import pytest

openai = pytest.importorskip("openai")

from protos.llmserve.v1 import llmserve_pb2 as pb  # noqa: E402

from tests.integration.http.conftest import API_KEY, AUTH  # noqa: E402


def _status(cluster):
    return cluster.stub.GetServerStatus(pb.GetServerStatusRequest(), timeout=10, metadata=AUTH)


def _wait_idle(cluster, timeout=5.0):
    deadline = time.monotonic() + timeout
    while True:
        s = _status(cluster)
        if (s.num_running == 0 and s.num_waiting == 0 and s.free_blocks == s.total_blocks) \
                or time.monotonic() > deadline:
            return s
        time.sleep(0.05)


def _post(cluster, path, body, key=API_KEY):
    req = urllib.request.Request(cluster.http_url + path, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json",
                                          **({"authorization": f"Bearer {key}"} if key else {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_models_lists_the_served_model(cluster, client, model_name):
    info = cluster.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10, metadata=AUTH)
    assert model_name == info.model_name
    assert [m.id for m in client.models.list().data] == [info.model_name]


def test_health_is_open_and_200(cluster):
    with urllib.request.urlopen(cluster.http_url + "/health", timeout=5) as r:
        assert r.status == 200


def test_metrics_serves_prometheus_text(cluster):
    with urllib.request.urlopen(cluster.http_url + "/metrics", timeout=5) as r:
        assert r.status == 200 and r.headers["content-type"].startswith("text/plain")


def test_streaming_chat(client, model_name):
    stream = client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "hello there"}], max_tokens=6,
        temperature=0, stream=True, extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == "length"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert isinstance(text, str) and all(c.object == "chat.completion.chunk" for c in chunks)


def test_stream_include_usage(client, model_name):
    chunks = list(client.completions.create(
        model=model_name, prompt="one two three", max_tokens=5, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    assert all(c.usage is None for c in chunks[:-1])


def test_completions_n2_with_logprobs(client, model_name):
    r = client.completions.create(model=model_name, prompt="the quick brown fox", n=2,
                                  max_tokens=4, temperature=1.0, seed=7, logprobs=3,
                                  extra_body={"ignore_eos": True})
    assert sorted(c.index for c in r.choices) == [0, 1]
    for c in r.choices:
        assert c.finish_reason == "length" and len(c.logprobs.tokens) == 4
        # the 3 most likely and the sampled token itself (OpenAI's logprobs + 1, as vLLM sends)
        assert all(len(top) <= 4 and top[t] == lp for top, t, lp in
                   zip(c.logprobs.top_logprobs, c.logprobs.tokens, c.logprobs.token_logprobs))
        assert all(lp <= 0 for lp in c.logprobs.token_logprobs)
    assert r.usage.completion_tokens == 8


def test_token_ids_equal_grpc_greedy(cluster, client, model_name):
    prompt = [5, 9, 11, 42]
    req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=prompt), params=pb.SamplingParams(
        max_tokens=8, temperature=0.0, ignore_eos=True))
    grpc_ids = list(cluster.stub.Complete(req, timeout=30, metadata=AUTH).choices[0].token_ids)
    r = client.completions.create(model=model_name, prompt=prompt, max_tokens=8, temperature=0,
                                  extra_body={"ignore_eos": True, "return_token_ids": True})
    assert r.choices[0].model_extra["token_ids"] == grpc_ids
    grpc_text = cluster.stub.Complete(req, timeout=30, metadata=AUTH).choices[0].text
    assert r.choices[0].text == grpc_text


def test_cancel_mid_stream_frees_everything(cluster, client, model_name):
    stream = client.completions.create(model=model_name, prompt="a long story", max_tokens=1500,
                                       temperature=0, stream=True, extra_body={"ignore_eos": True})
    for i, _ in enumerate(stream):
        if i == 3:
            break
    assert _status(cluster).num_running == 1
    stream.close()
    s = _wait_idle(cluster)
    assert s.num_running == 0 and s.free_blocks == s.total_blocks


def test_non_streaming_disconnect_aborts(cluster, model_name):
    short = openai.OpenAI(base_url=cluster.http_url + "/v1", api_key=API_KEY, max_retries=0,
                          timeout=1.0)
    with pytest.raises(openai.APITimeoutError):
        short.completions.create(model=model_name, prompt="go on", max_tokens=1500,
                                 temperature=0, extra_body={"ignore_eos": True})
    short.close()
    s = _wait_idle(cluster)
    assert s.num_running == 0 and s.free_blocks == s.total_blocks


@pytest.mark.parametrize("kwargs, field", [
    ({"temperature": -1}, "temperature"),
    ({"max_tokens": 100000}, "max_tokens"),
    ({"n": 0}, "n"),
    ({"top_p": 0}, "top_p"),
    ({"extra_body": {"min_p": 2.0}}, "min_p"),
    ({"max_tokens": "many"}, "max_tokens"),
])
def test_bad_requests_are_400_naming_the_field(client, model_name, kwargs, field):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model_name, prompt="hi", **kwargs)
    assert e.value.status_code == 400
    assert field in e.value.message and e.value.body["param"] == field


def test_malformed_json_is_400(cluster):
    req = urllib.request.Request(cluster.http_url + "/v1/completions", data=b"{not json",
                                 headers={"authorization": f"Bearer {API_KEY}",
                                          "content-type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 400 and "JSON" in json.loads(e.value.read())["error"]["message"]


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="hi", max_tokens=2)


def test_missing_or_wrong_key_is_401(cluster, model_name):
    for key in (None, "wrong"):
        status, body = _post(cluster, "/v1/completions", {"model": model_name, "prompt": "hi"}, key)
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
    with openai.OpenAI(base_url=cluster.http_url + "/v1", api_key="wrong", max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()


def test_tokenize_detokenize_round_trip(cluster):
    status, tok = _post(cluster, "/tokenize", {"prompt": "hello world", "add_special_tokens": False})
    assert status == 200 and tok["count"] == len(tok["tokens"]) > 0
    status, detok = _post(cluster, "/detokenize", {"tokens": tok["tokens"]})
    assert status == 200 and detok["prompt"] == "hello world"
    status, chat = _post(cluster, "/tokenize", {"messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and chat["count"] > 0
    status, err = _post(cluster, "/detokenize", {"tokens": [10 ** 9]})
    assert status == 400 and "vocabulary" in err["error"]["message"]


def test_chat_n2_with_top_logprobs_and_stop(client, model_name):
    r = client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "count"}], n=2, max_tokens=4,
        temperature=0.8, seed=3, logprobs=True, top_logprobs=2, stop=["\n\n\n"],
        extra_body={"ignore_eos": True, "top_k": 20, "min_p": 0.01, "repetition_penalty": 1.1})
    assert [c.index for c in r.choices] == [0, 1]
    for c in r.choices:
        assert c.message.role == "assistant" and len(c.logprobs.content) == 4
        assert all(len(t.top_logprobs) == 2 for t in c.logprobs.content)
    assert r.usage.completion_tokens == 8 and r.usage.total_tokens == r.usage.prompt_tokens + 8


def test_oversized_body_is_413_before_reading_it(cluster):
    host, port = cluster.http_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:  # headers only
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  b"authorization: Bearer " + API_KEY.encode() + b"\r\ncontent-length: 1000000000\r\n\r\n")
        answer = b""
        while b"}}" not in answer:
            chunk = s.recv(65536)
            if not chunk:
                break
            answer += chunk
        answer = answer.decode()
    assert answer.startswith("HTTP/1.1 413") and "body_too_large" in answer


def test_resource_exhausted_is_429_for_load_and_400_for_size():
    from scheduler_svc.api.admission import Overloaded
    from scheduler_svc.api.http.errors import status_of
    from scheduler_svc.messages import RequestError

    assert status_of(Overloaded("the server is full (...); retry later")) == 429
    assert status_of(RequestError("RESOURCE_EXHAUSTED", "3 prompts are already waiting to be "
                                  "tokenized; retry later")) == 429
    assert status_of(RequestError("RESOURCE_EXHAUSTED", "the request needs up to 9 KV blocks")) == 400
    assert status_of(RequestError("UNAVAILABLE", "the engine core process is gone")) == 503
