"""Structured outputs at both doors of the real services (the package's shared cluster): what
compiles runs, and the output of a random model at temperature 1 follows it (the executor's
masks); what does not compile is refused by name before any work, with exact status codes,
and the server serves on."""

import json
import re

import grpc
import jsonschema
import pytest

openai = pytest.importorskip("openai")

from protos.llmserve.v1 import llmserve_pb2 as pb  # noqa: E402
from tests.integration.http.conftest import AUTH  # noqa: E402

CHAT = [{"role": "user", "content": "Describe a person."}]
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


def _refused(call) -> dict:
    with pytest.raises(openai.BadRequestError) as e:
        call()
    assert e.value.status_code == 400, e.value.body
    return e.value.body


def _chat(client, model_name, **kwargs):
    return lambda: client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=8, **kwargs)


@pytest.mark.parametrize("kwargs, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"extra_body": {"structured_outputs": {"regex": "[0-9]{3}"}}}, "structured_outputs.regex"),
    ({"extra_body": {"structured_outputs": {"choice": ["yes", "no"]}}}, "structured_outputs.choice"),
    ({"extra_body": {"structured_outputs": {"grammar": 'start: "a"+'}}}, "structured_outputs.grammar"),
    ({"extra_body": {"guided_json": PERSON}}, "guided_json"),
], ids=["json_schema", "json_object", "regex", "choice", "grammar", "guided_json"])
def test_http_constraints_run_and_their_output_follows_them(client, model_name, kwargs, param):
    """Each form on the HTTP door runs (a random model at temperature 1: only the grammar makes
    its output valid), and what comes back matches the constraint."""
    r = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=200, temperature=1.0,
                                       seed=3, **kwargs)
    text, finish = r.choices[0].message.content, r.choices[0].finish_reason
    if finish != "stop":  # only JSON may run to max_tokens (an unbounded string): a prefix of one
        assert param in ("response_format.json_schema.schema", "guided_json", "response_format") and text.startswith("{")
        return
    if param in ("response_format.json_schema.schema", "guided_json"):
        jsonschema.validate(json.loads(text), PERSON)
    elif param == "response_format":
        assert isinstance(json.loads(text), dict)
    elif param.endswith("regex"):
        assert re.fullmatch("[0-9]{3}", text)
    elif param.endswith("choice"):
        assert text in ("yes", "no")
    else:
        assert re.fullmatch("a+", text)


def test_the_sdks_parse_helper_sends_a_schema_that_compiles(client, model_name):
    pydantic = pytest.importorskip("pydantic")

    class Person(pydantic.BaseModel):  # bounded: a random model's strings end only at their bound
        name: str = pydantic.Field(max_length=8)
        age: int = pydantic.Field(ge=0, le=99)
        tags: list[pydantic.constr(max_length=4)] = pydantic.Field(max_length=2)

    r = client.chat.completions.parse(model=model_name, messages=CHAT, max_tokens=300, temperature=1.0,
                                      seed=1, response_format=Person)
    assert r.choices[0].finish_reason == "stop" and isinstance(r.choices[0].message.parsed, Person)


@pytest.mark.parametrize("kwargs, param, says", [
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "unevaluatedProperties": False}}}},
     "response_format.json_schema.schema", 'Unimplemented keys: ["unevaluatedProperties"]'),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "format": "iban"}}}},
     "response_format.json_schema.schema", "Unknown format: iban"),
    ({"extra_body": {"structured_outputs": {"regex": "a(?=b)"}}}, "structured_outputs.regex", "look-around"),
    ({"extra_body": {"structured_outputs": {"grammar": "start: ("}}}, "structured_outputs.grammar", "Lark or GBNF"),
    ({"extra_body": {"structured_outputs": {"json": "{not json"}}}, "structured_outputs.json", "not valid JSON"),
    ({"extra_body": {"structured_outputs": {"regex": "a", "choice": ["a"]}}}, "structured_outputs", "exactly one of"),
    ({"extra_body": {"guided_choice": ["x"] * 1025}}, "guided_choice", "the limit is 1024"),
    ({"extra_body": {"guided_regex": "a" * 70_000}}, "guided_regex", "the limit is 65536"),
    ({"response_format": {"type": "json_object"}, "extra_body": {"guided_regex": "a"}}, "guided_regex", "both constrain"),
    ({"response_format": {"type": "json_object"}, "extra_body": {"min_tokens": 2}}, "min_tokens", "cannot be combined"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "needs json_schema"),
    ({"response_format": {"type": "xml"}}, "response_format.type", "Input should be"),
    ({"extra_body": {"guided_decoding_backend": "xgrammar"}}, "guided_decoding_backend", "backend"),
    ({"extra_body": {"structured_outputs": {"structural_tag": "{}"}}}, "structured_outputs.structural_tag",
     "structural tags"),
], ids=["unsupported_keyword", "unknown_format", "lookahead", "lark", "bad_json", "two_kinds", "many_choices",
        "too_large", "two_fields", "min_tokens", "no_schema", "bad_type", "backend", "structural_tag"])
def test_http_bad_constraints_are_400_naming_the_field(client, model_name, kwargs, param, says):
    body = _refused(_chat(client, model_name, **kwargs))
    assert body["param"] == param and says in body["message"], body


def test_completions_take_constraints_too(client, model_name):
    body = _refused(lambda: client.completions.create(
        model=model_name, prompt="Answer:", max_tokens=4, extra_body={"structured_outputs": {"regex": "(?<=a)b"}}))
    assert body["param"] == "structured_outputs.regex" and "look-around" in body["message"]
    r = client.completions.create(model=model_name, prompt="Answer:", max_tokens=40, temperature=1.0,
                                  extra_body={"guided_regex": "[a-z]{1,8}"})
    assert re.fullmatch("[a-z]{1,8}", r.choices[0].text) and r.choices[0].finish_reason == "stop"


def _grpc(cluster, **params):
    request = pb.GenerateRequest(text="Answer:", params=pb.SamplingParams(max_tokens=4, **params))
    with pytest.raises(grpc.RpcError) as e:
        list(cluster.stub.Generate(request, timeout=30, metadata=AUTH))
    return e.value


@pytest.mark.parametrize("params", [
    {"json_schema": '{"type": "object", "properties": {"a": {"type": "integer"}}}'},
    {"json_object": True, "json_whitespace": pb.JSON_WHITESPACE_COMPACT},
    {"regex": "[0-9]+"}, {"choice": pb.Choices(choices=["yes", "no"])}, {"grammar": 'start: "x"'},
], ids=["json_schema", "json_object", "regex", "choice", "grammar"])
def test_grpc_constraints_run(cluster, params):
    request = pb.GenerateRequest(text="Answer:", params=pb.SamplingParams(max_tokens=4, **params))
    outs = list(cluster.stub.Generate(request, timeout=60, metadata=AUTH))
    assert outs and outs[-1].finish_reason


@pytest.mark.parametrize("params, says", [
    ({"json_schema": '{"type": "array", "uniqueItems": true}'}, 'json_schema uses a JSON schema feature this server '
     'does not implement: Unimplemented keys: ["uniqueItems"]'),
    ({"json_schema": "[1, 2]"}, "json_schema: a JSON schema must be a JSON object"),
    ({"json_object": False}, "json_object must be true"),
    ({"regex": "(a)\\1"}, "regex is not a regex this server can compile"),
    ({"choice": pb.Choices()}, "choice must list at least one choice"),
    ({"grammar": "start: nothing_here"}, "grammar is not a grammar this server can compile"),
    ({"json_schema": '{"type": "object"}', "ignore_eos": True}, "ignore_eos=True cannot be combined with json_schema"),
], ids=["unsupported_keyword", "not_an_object", "json_object_false", "backreference", "no_choices",
        "undefined_rule", "ignore_eos"])
def test_grpc_bad_constraints_are_invalid_argument_naming_the_field(cluster, params, says):
    e = _grpc(cluster, **params)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and says in e.details(), e.details()


def test_the_server_serves_on(cluster, client, model_name):
    r = client.completions.create(model=model_name, prompt="hello", max_tokens=3, temperature=0)
    assert r.choices[0].finish_reason in ("length", "stop")
    status = cluster.stub.GetServerStatus(pb.GetServerStatusRequest(), timeout=10, metadata=AUTH)
    assert status.executor_available
