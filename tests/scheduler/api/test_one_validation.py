"""One validation for both doors, as a property: request bodies generated over each field's
full JSON range (HTTP) and each field's full wire type (gRPC) either get a 4xx /
INVALID_ARGUMENT naming a field the client sent, or run — planned by the scheduler core,
encoded by the plan codec and accepted by the executor's plan checks (one_validation_harness).
Nothing raises: a 500 or an unexpected exception fails the test."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from protos.llmserve.v1 import llmserve_pb2 as pb
from scheduler_svc.api.admission import Admission
from scheduler_svc.api.grpc.servicer import LLMServeServicer
from scheduler_svc.api.http.app import build_app
from scheduler_svc.api.http.context import HttpContext
from scheduler_svc.api.tokenize_pool import TokenizePool
from scheduler_svc.api.validation import SizeLimits
from scheduler_svc.core.tokenizer import Tokenizer
from tests.scheduler.api.one_validation_harness import INFO, CheckingEngine

EDGE_INTS = [-(2**64), -(2**63), -(2**31) - 1, -(2**31), -2, -1, 0, 1, 2, 16, 20, 21, 128, 129, 255,
             256, 511, 512, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**70]
EDGE_FLOATS = [-0.0, 0.0, 1e-50, -1e-50, 1e-45, 1e-39, 1.1754943e-38, 1e-5, 0.5, 1.0, 1.5, 2.0, 2.5,
               -2.0, -2.5, 100.0, 100.5, 3.4028234e38, 3.4028236e38, 3.5e38, 1e39, -1e39, 1e308,
               float("inf"), float("-inf"), float("nan")]
ints = st.one_of(st.sampled_from(EDGE_INTS), st.integers(-(2**70), 2**70), st.integers(-3, 300))
floats = st.one_of(st.sampled_from(EDGE_FLOATS), st.floats(allow_nan=True, allow_infinity=True),
                   st.floats(-3, 3))
numbers = st.one_of(ints, floats)
anything = st.recursive(st.none() | st.booleans() | numbers | st.text(max_size=4),
                        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=2),
                        max_leaves=4)


def either(typed) -> st.SearchStrategy:
    return st.one_of(typed, typed, typed, anything)  # mostly the field's own type


SAMPLING_FIELDS = {
    "n": either(st.one_of(st.integers(-2, 4), ints)),
    "max_tokens": either(st.one_of(st.integers(-2, 300), ints)),
    "temperature": either(numbers), "top_p": either(numbers), "top_k": either(ints),
    "seed": either(ints), "presence_penalty": either(numbers), "frequency_penalty": either(numbers),
    "repetition_penalty": either(numbers), "min_p": either(numbers), "min_tokens": either(ints),
    "stop": either(st.one_of(st.text(max_size=3), st.lists(st.text(max_size=3), max_size=20))),
    "stop_token_ids": either(st.lists(ints, max_size=5)),
    "logit_bias": either(st.dictionaries(st.one_of(ints.map(str), st.text(max_size=3)), numbers, max_size=4)),
    "ignore_eos": either(st.booleans()), "include_stop_str_in_output": either(st.booleans()),
    "user": either(st.text(max_size=5)), "prompt_logprobs": either(st.one_of(st.integers(-2, 25), ints)),
    # fields this server does not implement: refused by name
    "response_format": st.sampled_from([{"type": "json_object"}, {"type": "bogus"}, None]),
    "tools": st.just([]), "guided_json": st.just({}),
}
COMPLETION_FIELDS = {**SAMPLING_FIELDS, "logprobs": either(ints), "echo": either(st.booleans()),
                     "best_of": either(ints), "prompt": either(st.lists(st.lists(st.integers(-2, 600),
                                                                                 max_size=3), max_size=3))}
CHAT_FIELDS = {**SAMPLING_FIELDS, "max_completion_tokens": either(ints), "logprobs": either(st.booleans()),
               "top_logprobs": either(ints)}


def bodies(fields: dict, base: dict) -> st.SearchStrategy:
    subset = st.lists(st.sampled_from(sorted(fields)), max_size=5, unique=True)
    return subset.flatmap(lambda names: st.fixed_dictionaries({k: fields[k] for k in names})
                          ).map(lambda extra: {**base, **extra})


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from executor_svc.model_loader.random_model import build_tokenizer

    folder = tmp_path_factory.mktemp("tok")
    build_tokenizer(folder, vocab_size=INFO.vocab_size, max_model_len=INFO.max_model_len)
    return Tokenizer(folder)


@pytest.fixture(scope="module")
def http(tokenizer):
    engine = CheckingEngine()
    pool = TokenizePool(tokenizer, num_workers=1, max_pending=64)
    admission = Admission(engine, pool, SizeLimits(), max_waiting=64, prefix_caching=False)
    with TestClient(build_app(HttpContext(admission, tokenizer, "tiny"), 64 << 20)) as client:
        yield client, engine
    pool.close()


def _check_http(client, path: str, body: dict) -> None:
    r = client.post(path, content=json.dumps(body, allow_nan=True), headers={"content-type": "application/json"})
    if r.status_code == 200:
        return
    assert 400 <= r.status_code < 500, (r.status_code, r.text, body)
    error = r.json()["error"]
    assert error["param"], f"a refusal names its field: {error} for {body}"
    assert error["param"].split(".")[0] in body, f"param {error['param']!r} was not sent: {body}"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies(COMPLETION_FIELDS, {"prompt": [5, 6, 7], "max_tokens": 4}))
def test_completions_bodies_are_refused_by_name_or_run(http, body):
    _check_http(http[0], "/v1/completions", body)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies(CHAT_FIELDS, {"messages": [{"role": "user", "content": "hi"}]}))
def test_chat_bodies_are_refused_by_name_or_run(http, body):
    _check_http(http[0], "/v1/chat/completions", body)


def test_the_property_sees_requests_that_run(http):
    """(The oracle is not vacuous: valid bodies cross to the executor's rows.)"""
    client, engine = http
    before = engine.num_ran
    for body in [{"prompt": [5], "seed": 2**64 - 1, "top_k": 2**31, "temperature": 3.4e38},
                 {"prompt": [5], "n": 3, "top_p": 1e-30, "repetition_penalty": 1e-30, "min_tokens": 16}]:
        assert client.post("/v1/completions", json=body).status_code == 200, body
    assert engine.num_ran == before + 2


# --- gRPC: every field over its wire type -----------------------------------------------------

U32, I32, U64 = st.integers(0, 2**32 - 1), st.integers(-(2**31), 2**31 - 1), st.integers(0, 2**64 - 1)
F32 = st.one_of(st.sampled_from(EDGE_FLOATS[:22] + [float("inf"), float("-inf"), float("nan")]),
                st.floats(width=32, allow_nan=True, allow_infinity=True))
GRPC_FIELDS = {
    "max_tokens": st.one_of(st.integers(0, 300), U32), "temperature": F32, "top_k": I32, "top_p": F32,
    "seed": U64, "n": st.one_of(st.integers(0, 4), U32), "logprobs": st.booleans(),
    "top_logprobs": st.one_of(st.integers(0, 25), U32), "prompt_logprobs": st.one_of(st.integers(0, 25), U32),
    "presence_penalty": F32, "frequency_penalty": F32, "repetition_penalty": F32, "min_p": F32,
    "min_tokens": st.one_of(st.integers(0, 20), U32), "ignore_eos": st.booleans(),
    "stop_token_ids": st.lists(I32, max_size=4), "logit_bias": st.dictionaries(I32, F32, max_size=4),
    # structured outputs (one oneof: the last set wins)
    "regex": st.text(max_size=6), "grammar": st.text(max_size=6),
    "json_schema": st.one_of(st.text(max_size=6), st.sampled_from(['{"type": "integer"}', '{"not": {}}', "[]"])),
}


class Aborted(Exception):
    def __init__(self, code, message):
        super().__init__(code, message)
        self.code, self.message = code, message


class Context:
    async def abort(self, code, message):
        raise Aborted(code, message)


@pytest.fixture(scope="module")
def grpc_servicer(tokenizer):
    engine = CheckingEngine()
    pool = TokenizePool(tokenizer, num_workers=1, max_pending=64)
    admission = Admission(engine, pool, SizeLimits(), max_waiting=64, prefix_caching=False)
    yield LLMServeServicer(admission, "tiny"), engine
    admission.close()
    pool.close()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fields=st.lists(st.sampled_from(sorted(GRPC_FIELDS)), max_size=5, unique=True).flatmap(
    lambda names: st.fixed_dictionaries({k: GRPC_FIELDS[k] for k in names})))
def test_grpc_params_are_refused_by_name_or_run(grpc_servicer, fields):
    servicer, _ = grpc_servicer
    params = pb.SamplingParams(**{k: v for k, v in fields.items() if k not in ("stop_token_ids", "logit_bias")})
    params.stop_token_ids.extend(fields.get("stop_token_ids", []))
    for k, v in fields.get("logit_bias", {}).items():
        params.logit_bias[k] = v
    request = pb.GenerateRequest(token_ids=pb.TokenIds(ids=[5, 6, 7]), params=params)
    try:
        asyncio.run(servicer.Complete(request, Context()))
    except Aborted as e:
        assert e.code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED), e.message
        assert any(name in e.message for name in fields), f"{e.message!r} names none of {sorted(fields)}"


def test_grpc_fields_this_server_does_not_know_are_refused_by_name():
    """A newer client's field (a number our proto lacks) is refused, not silently dropped."""
    from scheduler_svc.api.grpc.handlers import Refused, _deserializer

    parse = _deserializer(pb.GenerateRequest, 1 << 20)
    known = pb.GenerateRequest(text="hi", params=pb.SamplingParams(max_tokens=3))
    assert parse(known.SerializeToString()) == known
    field_99 = bytes([(99 << 3 & 0x7F) | 0x80, 99 >> 4, 5])  # field 99, varint 5
    params = pb.SamplingParams(max_tokens=3).SerializeToString() + field_99
    wire = pb.GenerateRequest(text="hi").SerializeToString() + bytes([0x22, len(params)]) + params
    refused = parse(wire)
    assert isinstance(refused, Refused) and refused.code == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.message.startswith("params.#99: field number 99 is unknown to this")
    chat = pb.GenerateRequest(chat=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="x")]))
    turn = pb.ChatMessage(role="user", content="y").SerializeToString() + field_99
    chat_body = chat.chat.SerializeToString() + bytes([0x0A, len(turn)]) + turn
    wire = bytes([0x1A, len(chat_body)]) + chat_body
    assert parse(wire).message.startswith("chat.messages[1].#99")
