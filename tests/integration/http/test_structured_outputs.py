"""Structured outputs at both doors of the real services (the package's shared cluster): what
compiles is refused after validation, with one clear message, until the executor applies the
masks (never generated unconstrained); what does not compile is refused by name before any
work, with exact status codes, and the server serves on."""

import grpc
import pytest

openai = pytest.importorskip("openai")

from protos.llmserve.v1 import llmserve_pb2 as pb  # noqa: E402
from scheduler_svc.api.structured import NOT_APPLIED  # noqa: E402
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
def test_http_constraints_that_compile_are_not_yet_run(client, model_name, kwargs, param):
    body = _refused(_chat(client, model_name, **kwargs))
    assert body["param"] == param and body["message"].startswith(NOT_APPLIED), body


def test_the_sdks_parse_helper_sends_a_schema_that_compiles(client, model_name):
    pydantic = pytest.importorskip("pydantic")

    class Person(pydantic.BaseModel):
        name: str
        age: int
        tags: list[str]

    body = _refused(lambda: client.chat.completions.parse(model=model_name, messages=CHAT,
                                                          max_tokens=8, response_format=Person))
    assert body["message"].startswith(NOT_APPLIED), body


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
    assert NOT_APPLIED not in body["message"]


def test_completions_take_constraints_too(client, model_name):
    body = _refused(lambda: client.completions.create(
        model=model_name, prompt="Answer:", max_tokens=4, extra_body={"structured_outputs": {"regex": "(?<=a)b"}}))
    assert body["param"] == "structured_outputs.regex" and "look-around" in body["message"]
    body = _refused(lambda: client.completions.create(
        model=model_name, prompt="Answer:", max_tokens=4, extra_body={"guided_regex": "[a-z]+"}))
    assert body["message"].startswith(NOT_APPLIED)


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
def test_grpc_constraints_that_compile_are_not_yet_run(cluster, params):
    e = _grpc(cluster, **params)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and e.details().startswith(NOT_APPLIED), e.details()


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
