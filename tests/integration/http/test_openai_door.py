"""The HTTP door held to the gRPC door's standard, through the `openai` package on both real
services: the values that used to crash the engine core or fail a whole step are 400s naming
the field as the client spelled it, and the server keeps serving; unimplemented fields are
refused by name, harmless ones ignored; every route answers in OpenAI's error shape."""

import json
import urllib.error
import urllib.request

import pytest

openai = pytest.importorskip("openai")

from tests.integration.http.conftest import API_KEY  # noqa: E402
from tests.integration.http.test_openai_http import _post  # noqa: E402


def _greedy(client, model_name):
    return client.completions.create(model=model_name, prompt="hello", max_tokens=6, temperature=0,
                                     extra_body={"return_token_ids": True}).choices[0].token_ids


# Each killed the engine core (codec) or failed every row of its step (executor plan check).
CRASHERS = [
    ({"seed": -1}, "seed"), ({"seed": 2**64}, "seed"),
    ({"extra_body": {"min_tokens": -1}}, "min_tokens"),
    ({"temperature": 1e39}, "temperature"), ({"top_p": 1e-50}, "top_p"),
    ({"extra_body": {"repetition_penalty": 1e39}}, "repetition_penalty"),
    ({"extra_body": {"repetition_penalty": 1e-50}}, "repetition_penalty"),
    ({"presence_penalty": 1e39}, "presence_penalty"),
]


@pytest.mark.parametrize("kwargs, field", CRASHERS, ids=[f"{f}={list(k.values())}" for k, f in CRASHERS])
def test_values_past_the_wire_are_400_and_the_server_serves_on(client, model_name, kwargs, field):
    before = _greedy(client, model_name)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model_name, prompt="hi", max_tokens=2, **kwargs)
    assert e.value.status_code == 400 and e.value.body["param"] == field, e.value.body
    assert _greedy(client, model_name) == before  # the same engine, unharmed


def test_a_huge_top_k_means_no_cut(client, model_name):
    """top_k at or past the vocabulary cuts nothing: it runs (2^31 used to kill the core)."""
    base = dict(model=model_name, prompt="hi", max_tokens=4, seed=5, temperature=1.0)
    plain = client.completions.create(**base, extra_body={"return_token_ids": True}).choices[0].token_ids
    huge = client.completions.create(**base, extra_body={"return_token_ids": True, "top_k": 2**31})
    assert huge.choices[0].token_ids == plain


def test_param_is_named_as_the_client_sent_it(client, model_name):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "hi"}],
                                       max_completion_tokens=-3)
    assert e.value.body["param"] == "max_completion_tokens"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model_name, prompt="hi", max_tokens=2, logprobs=21)
    assert e.value.body["param"] == "logprobs"


@pytest.mark.parametrize("extra", [
    {"guided_decoding_backend": "xgrammar"},  # (structured outputs: test_structured_outputs.py)
    {"tool_choice": "auto"}, {"functions": []},  # (tools: tools/test_tool_calls.py)
    {"no_such_field": 1},
])
def test_unimplemented_fields_are_refused_by_name(client, model_name, extra):
    name = next(iter(extra))
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=2, extra_body=extra)
    assert e.value.body["param"] == name and name in e.value.message


def test_fields_that_cannot_change_the_output_are_ignored(client, model_name):
    base = dict(model=model_name, messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0)
    plain = client.chat.completions.create(**base).choices[0].message.content
    with_extras = client.chat.completions.create(**base, user="u1", metadata={"k": "v"}, store=False,
                                                 service_tier="auto", extra_body={"prompt_cache_key": "x"})
    assert with_extras.choices[0].message.content == plain


def test_completions_default_to_16_tokens(client, model_name):
    out = client.completions.create(model=model_name, prompt="hello", temperature=0,
                                    extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 16


def test_models_by_id(client, model_name):
    assert client.models.retrieve(model_name).id == model_name
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


@pytest.mark.parametrize("method, path", [("GET", "/v1/embeddings"), ("POST", "/v1/embeddings"),
                                          ("POST", "/v1/audio/speech"), ("GET", "/nope")])
def test_unknown_routes_are_404_in_openai_shape(cluster, method, path):
    req = urllib.request.Request(cluster.http_url + path, method=method, data=b"{}" if method == "POST" else None,
                                 headers={"authorization": f"Bearer {API_KEY}", "content-type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    body = json.loads(e.value.read())
    assert e.value.code == 404 and set(body["error"]) == {"message", "type", "param", "code"}
    assert path in body["error"]["message"]


def test_wrong_method_is_405_in_openai_shape(cluster):
    status, body = _post(cluster, "/v1/models", {})
    assert status == 405 and "message" in body["error"]
