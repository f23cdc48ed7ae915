"""POST /v1/messages in process, with the official `anthropic` client, on a scripted engine (the
model's text is given, in chosen pieces): text and hermes calls as content blocks, a stream that
adds up to the collected message, stop reasons, an engine error after the stream began (an
`error` event), the prompt the blocks became, and errors in Anthropic's shape."""

import contextlib

import pytest

anthropic = pytest.importorskip("anthropic")

from scheduler_svc.api.tools.plan import ToolSettings  # noqa: E402
from scheduler_svc.core.request import FinishReason  # noqa: E402
from scheduler_svc.messages import RequestError  # noqa: E402
from tests.scheduler.api.tools.scripted import serving  # noqa: E402

WEATHER = {"name": "get_weather", "description": "Weather",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
HI = [{"role": "user", "content": "hi"}]


@contextlib.contextmanager
def _served(tok, settings=ToolSettings()):
    with serving(tok, settings) as (openai_client, engine):
        http = openai_client._client  # the TestClient
        with anthropic.Anthropic(base_url="http://testserver", api_key="k", http_client=http,
                                 max_retries=0) as client:
            yield client, engine


@pytest.fixture
def served(tok):
    with _served(tok) as s:
        yield s


@pytest.fixture
def auto(tok):
    with _served(tok, ToolSettings(auto=True, parser="hermes")) as s:
        yield s


def _create(client, **kw):
    return client.messages.create(**{"model": "tiny", "max_tokens": 16, "messages": HI, **kw})


def _blocks(message, drop=()) -> list[dict]:
    return [{k: v for k, v in b.model_dump(exclude_none=True).items() if k not in drop} for b in message.content]


def _streamed(client, **kw):
    with client.messages.stream(**{"model": "tiny", "max_tokens": 16, "messages": HI, **kw}) as stream:
        events = list(stream)
        return events, stream.get_final_message()


def test_pieces_are_one_text_block_and_the_stream_adds_up(served):
    client, engine = served
    engine.script, engine.finish = [["Hel", "lo", " there"]], FinishReason.EOS
    m = _create(client)
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_") and m.model == "tiny"
    assert _blocks(m) == [{"type": "text", "text": "Hello there"}]
    assert (m.stop_reason, m.stop_sequence) == ("end_turn", None)
    assert (m.usage.input_tokens, m.usage.output_tokens) == (len(engine.prompts[-1]), 3)
    events, final = _streamed(client)
    raw = [e for e in events if e.type in ("message_start", "content_block_start", "content_block_delta",
                                           "content_block_stop", "message_delta", "message_stop")]
    assert [e.type for e in raw] == ["message_start", "content_block_start", *["content_block_delta"] * 3,
                                     "content_block_stop", "message_delta", "message_stop"]
    assert [e.delta.text for e in raw if e.type == "content_block_delta"] == ["Hel", "lo", " there"]
    assert raw[0].message.stop_reason is None and raw[0].message.content == []
    assert _blocks(final) == _blocks(m) and final.stop_reason == "end_turn" and final.usage == m.usage


def test_an_empty_answer_has_no_blocks(served):
    client, engine = served
    engine.script = [[""]]
    assert _create(client).content == []
    events, final = _streamed(client)
    assert [e.type for e in events if e.type.startswith(("content_block", "message"))] == [
        "message_start", "message_delta", "message_stop"] and final.content == []


def test_max_tokens_is_the_stop_reason_of_a_cut_answer(served):
    client, engine = served
    engine.script, engine.finish = [["a", "b"]], FinishReason.LENGTH
    assert _create(client).stop_reason == _streamed(client)[1].stop_reason == "max_tokens"


def test_auto_calls_are_tool_use_blocks_in_the_order_written(auto):
    client, engine = auto
    engine.script = [["Let me look.", "\n<tool_call>\n{\"name\": \"get_weather\", \"argu", "ments\": {\"city\": ",
                      "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>"]]
    m = _create(client, tools=[WEATHER])
    assert [b.type for b in m.content] == ["text", "tool_use", "tool_use"] and m.stop_reason == "tool_use"
    assert m.content[0].text == "Let me look." and m.content[1].input == {"city": "Paris"}
    assert m.content[2].input == {} and m.content[1].name == "get_weather" and m.content[1].id.startswith("toolu_")
    events, final = _streamed(client, tools=[WEATHER])
    assert _blocks(final, drop=("id",)) == _blocks(m, drop=("id",))
    json_deltas = [e.delta.partial_json for e in events if e.type == "content_block_delta" and e.index == 1]
    assert "".join(json_deltas) == '{"city": "Paris"}' and final.stop_reason == "tool_use"
    one = _create(client, tools=[WEATHER], tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    assert [b.type for b in one.content] == ["text", "tool_use"]


def test_an_engine_error_after_the_stream_began_is_an_error_event(served):
    client, engine = served

    async def failing(prompt_ids, params):
        yield await _out("partial")
        raise RequestError("UNAVAILABLE", "the executor is unavailable")

    async def _out(text):
        from scheduler_svc.core.outputs import RequestOutput
        return RequestOutput(1, [5], text, None, "", 3, 1)

    engine.generate = failing
    with pytest.raises(anthropic.APIStatusError) as e:
        _streamed(client)
    assert e.value.body["error"] == {"type": "overloaded_error", "message": "the executor is unavailable"}


def test_blocks_become_the_chat_prompt(auto, tok):
    client, engine = auto
    _create(client, system=[{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}], tools=[WEATHER],
            messages=[{"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
                      {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
                                                        {"type": "tool_use", "id": "t1", "name": "get_weather",
                                                         "input": {"city": "Paris"}}]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"},
                                                   {"type": "text", "text": "thanks", "cache_control": {"type": "ephemeral"}}]}])
    prompt = tok.decode(engine.prompts[-1], skip_special_tokens=False)
    assert "Be brief." in prompt and '"city": "Paris"' in prompt and "sunny" in prompt
    assert prompt.index("Checking.") < prompt.index("sunny") < prompt.index("thanks")


def test_errors_are_in_anthropics_shape(served):
    client, _ = served
    with pytest.raises(anthropic.BadRequestError) as e:
        _create(client, extra_body={"temperature": 1.5})  # (the SDK has no temperature argument)
    assert e.value.body == {"type": "error", "error": {"type": "invalid_request_error", "message":
                                                       "temperature must be in [0, 1] (Anthropic's range; 0 = "
                                                       "greedy), got 1.5"}}  # (led by its field already)
    with pytest.raises(anthropic.NotFoundError) as e:
        _create(client, model="claude-x")
    assert e.value.body["error"]["type"] == "not_found_error" and e.value.body["error"]["message"].startswith("model: ")
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="tiny", max_tokens=4, messages=HI, extra_body={"frequency_penalty": 1})
    assert e.value.body["error"]["message"].startswith("frequency_penalty: ")


@pytest.mark.parametrize("messages, field", [
    ([{"role": "user", "content": [{"type": "text", "text": ""}]}], "messages.0.content.0.text"),
    ([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                    "content": [{"type": "text", "text": ""}]}]}], "messages.0.content.0.content"),
])
def test_an_empty_text_block_is_refused_naming_it(served, messages, field):
    client, engine = served
    with pytest.raises(anthropic.BadRequestError) as e:
        _create(client, messages=messages)
    assert e.value.status_code == 400 and e.value.body["error"]["type"] == "invalid_request_error"
    assert field in e.value.body["error"]["message"] and not engine.prompts
