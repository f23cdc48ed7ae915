"""The Messages API's tool_use blocks under tool_choice "auto" (the default with tools; the
hermes parser), with the `anthropic` client, on the chain model: its greedy output is
CALL_PIECES (content, then two hermes calls), so the content blocks and their events are known
exactly."""

import pytest

anthropic = pytest.importorskip("anthropic")

from tests.integration.http.tools.conftest import CALL_PIECES  # noqa: E402

WEATHER = {"name": "get_weather", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "array"}}, "required": ["city"]}}
TIME = {"name": "get_time", "input_schema": {"type": "object", "properties": {"tz": {"type": "string"}}}}
BLOCKS = [{"type": "text", "text": "I will check."},
          {"type": "tool_use", "name": "get_weather", "input": {"city": "Paris", "days": [1, 2]}},
          {"type": "tool_use", "name": "get_time", "input": {"tz": "Europe/Paris"}}]


@pytest.fixture(scope="module")
def claude(chain_cluster):
    with anthropic.Anthropic(base_url=chain_cluster.http_url, api_key="none", max_retries=0, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def model(chain):
    return chain.models.list().data[0].id  # (the openai client's GET /v1/models)


def _kw(model, **kw):
    return {"model": model, "max_tokens": 32, "messages": [{"role": "user", "content": "Weather and time in Paris?"}],
            "tools": [WEATHER, TIME], "extra_body": {"temperature": 0}, **kw}


def _blocks(message) -> list[dict]:
    return [{k: v for k, v in b.model_dump(exclude_none=True).items() if k != "id"} for b in message.content]


def test_content_then_two_tool_use_blocks(claude, model):
    m = claude.messages.create(**_kw(model))
    assert _blocks(m) == BLOCKS and m.stop_reason == "tool_use"
    assert m.usage.output_tokens == len(CALL_PIECES) + 1  # the pieces and EOS
    assert len({b.id for b in m.content[1:]}) == 2 and all(b.id.startswith("toolu_") for b in m.content[1:])


def test_the_stream_adds_up_to_the_same_blocks(claude, model):
    with claude.messages.stream(**_kw(model)) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert _blocks(final) == BLOCKS and final.stop_reason == "tool_use"
    starts = [e.content_block.type for e in events if e.type == "content_block_start"]
    assert starts == ["text", "tool_use", "tool_use"]
    pieces = [e.delta.partial_json for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
    assert "".join(pieces) == '{"city": "Paris", "days": [1, 2]}{"tz": "Europe/Paris"}' and len(pieces) > 2


def test_disable_parallel_tool_use_keeps_the_first_call(claude, model):
    m = claude.messages.create(**_kw(model, tool_choice={"type": "auto", "disable_parallel_tool_use": True}))
    assert _blocks(m) == BLOCKS[:2] and m.stop_reason == "tool_use"


@pytest.fixture(scope="module")
def builtin_claude(builtin_cluster):
    with anthropic.Anthropic(base_url=builtin_cluster.http_url, api_key="none", max_retries=0, timeout=60) as c:
        yield c


def test_the_builtin_model_streams_a_message(builtin_claude, builtin):
    """Issue 25's "a Messages streaming call works with the built-in model": the streamed text is
    the collected message's, and the usage agrees."""
    kw = {"model": builtin.models.list().data[0].id, "max_tokens": 24, "system": "Answer in one sentence.",
          "messages": [{"role": "user", "content": "What is the capital of France?"}],
          "extra_body": {"temperature": 0}}
    collected = builtin_claude.messages.create(**kw)
    with builtin_claude.messages.stream(**kw) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert collected.stop_reason in ("end_turn", "max_tokens") and final.stop_reason == collected.stop_reason
    assert text == collected.content[0].text == final.content[0].text and text.strip()
    assert final.usage.output_tokens == collected.usage.output_tokens <= 24
    assert final.usage.input_tokens == collected.usage.input_tokens == builtin_claude.messages.count_tokens(
        model=kw["model"], system=kw["system"], messages=kw["messages"]).input_tokens


def test_the_builtin_model_uses_a_named_tool(builtin_claude, builtin):
    weather = {"name": "get_weather", "input_schema": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
        "additionalProperties": False}}
    m = builtin_claude.messages.create(
        model=builtin.models.list().data[0].id, max_tokens=40, tools=[weather],
        tool_choice={"type": "tool", "name": "get_weather"}, extra_body={"temperature": 0},
        messages=[{"role": "user", "content": "What is the weather in Paris?"}])
    assert m.stop_reason == "tool_use" and [b.type for b in m.content] == ["tool_use"]
    assert m.content[0].name == "get_weather" and isinstance(m.content[0].input["city"], str)
