"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) on both real services
(the package's cluster: a tiny random llama, no tool flags), driven with the `anthropic` package
and compared with chat completions of the same messages on the same engine (greedy:
token-exact). This SDK has no temperature argument: it goes in extra_body, as Anthropic's
field."""

import json

import pytest

anthropic = pytest.importorskip("anthropic")
jsonschema = pytest.importorskip("jsonschema")

from protos.llmserve.v1 import llmserve_pb2 as pb  # noqa: E402
from tests.integration.http.conftest import API_KEY, AUTH, wait_until_idle  # noqa: E402

WEATHER = {"name": "get_weather", "description": "Weather forecast",
           "input_schema": {"type": "object", "additionalProperties": False, "required": ["city", "days"],
                            "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
                                           "days": {"type": "integer", "minimum": 1, "maximum": 7}}}}
CHAT_WEATHER = {"type": "function", "function": {"name": WEATHER["name"], "description": WEATHER["description"],
                                                 "parameters": WEATHER["input_schema"]}}
CUT = 8  # max_tokens where the greedy answer is cut (checked against chat's "length")
GREEDY = {"temperature": 0}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
# forced calls sample at temperature 1 with a seed (an extra) whose call ends within the budget
FORCED = {"max_tokens": 300}


@pytest.fixture(scope="module")
def claude(cluster):
    with anthropic.Anthropic(base_url=cluster.http_url, api_key=API_KEY, max_retries=0, timeout=60) as c:
        yield c


def _create(claude, model_name, messages, extra=GREEDY, **kw):
    return claude.messages.create(model=model_name, messages=messages, extra_body=extra, **{"max_tokens": CUT, **kw})


def _streamed(claude, model_name, messages, extra=GREEDY, **kw):
    with claude.messages.stream(model=model_name, messages=messages, extra_body=extra,
                                **{"max_tokens": CUT, **kw}) as stream:
        return list(stream), stream.get_final_message()


def _chat(client, model_name, messages, **kw):
    return client.chat.completions.create(model=model_name, messages=messages, temperature=0, **{"max_tokens": CUT, **kw})


def _blocks(message, drop=()) -> list[dict]:
    return [{k: v for k, v in b.model_dump(exclude_none=True).items() if k not in drop} for b in message.content]


def _dumped(message) -> list[dict]:
    """A message's content as the next request's assistant turn."""
    return [b.model_dump(exclude_none=True) for b in message.content]


def _text(message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


# ---------------------------------------------------------------- text


def test_text_equals_chat_and_is_cut_by_max_tokens(claude, client, model_name):
    chat = _chat(client, model_name, [{"role": "user", "content": "hello there"}])
    assert chat.choices[0].finish_reason == "length"  # the greedy answer runs past CUT tokens
    m = _create(claude, model_name, [{"role": "user", "content": "hello there"}])
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_") and m.model == model_name
    assert _blocks(m) == [{"type": "text", "text": chat.choices[0].message.content}]
    assert (m.stop_reason, m.stop_sequence) == ("max_tokens", None)
    assert (m.usage.input_tokens, m.usage.output_tokens) == (chat.usage.prompt_tokens, CUT)
    assert (m.usage.cache_read_input_tokens, m.usage.cache_creation_input_tokens) == (0, 0)


def test_streamed_events_add_up_to_the_created_message(claude, model_name):
    ask = [{"role": "user", "content": "hello there"}]
    created = _create(claude, model_name, ask)
    events, final = _streamed(claude, model_name, ask)
    assert _blocks(final) == _blocks(created) and final.stop_reason == created.stop_reason == "max_tokens"
    assert final.usage == created.usage and final.id != created.id
    raw = list(claude.messages.create(model=model_name, messages=ask, max_tokens=CUT, stream=True, extra_body=GREEDY))
    types = [e.type for e in raw]
    assert types[:2] == ["message_start", "content_block_start"] and types[-3:] == [
        "content_block_stop", "message_delta", "message_stop"] and set(types[2:-3]) == {"content_block_delta"}
    assert raw[0].message.content == [] and raw[0].message.stop_reason is None
    assert raw[0].message.usage.input_tokens == created.usage.input_tokens and raw[1].content_block.text == ""
    assert "".join(e.delta.text for e in raw[2:-3]) == _text(created)
    assert (raw[-2].delta.stop_reason, raw[-2].usage.output_tokens) == ("max_tokens", CUT)


def test_system_and_blocks_render_as_the_same_chat(claude, client, model_name):
    first = _create(claude, model_name, [{"role": "user", "content": "hi"}], max_tokens=4)
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _dumped(first)},
                {"role": "user", "content": [{"type": "text", "text": "how "},
                                             {"type": "text", "text": "are you", "cache_control": {"type": "ephemeral"}}]}]
    m = _create(claude, model_name, messages, system=[{"type": "text", "text": "You are "}, {"type": "text", "text": "terse."}])
    chat = _chat(client, model_name, [
        {"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": _text(first)}, {"role": "user", "content": "how are you"}])
    assert _text(m) == chat.choices[0].message.content
    assert (m.usage.input_tokens, m.usage.output_tokens) == (chat.usage.prompt_tokens, chat.usage.completion_tokens)
    count = claude.messages.count_tokens(model=model_name, messages=messages, system="You are terse.")
    assert count.input_tokens == m.usage.input_tokens


def test_a_stop_sequence_ends_the_text_before_it(claude, client, model_name):
    ask = [{"role": "user", "content": "tell me a story"}]
    full = _text(_create(claude, model_name, ask, max_tokens=24))
    stop = next(full[i:i + 3] for i in range(6, len(full) - 3) if full[i:i + 3].strip())
    m = _create(claude, model_name, ask, max_tokens=24, stop_sequences=["\u2603never", stop])
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", stop)
    assert _text(m) == full[:full.index(stop)] == _chat(client, model_name, ask, max_tokens=24, stop=[stop]).choices[0].message.content
    _, final = _streamed(claude, model_name, ask, max_tokens=24, stop_sequences=[stop])
    assert (final.stop_reason, final.stop_sequence, _text(final)) == ("stop_sequence", stop, _text(m))


def test_count_tokens_is_the_messages_input_tokens(claude, model_name):
    kw = {"system": "Be brief.", "tools": [WEATHER], "tool_choice": {"type": "any"}}
    count = claude.messages.count_tokens(model=model_name, messages=ASK, **kw)
    m = _create(claude, model_name, ASK, extra={"temperature": 1.0, "seed": 5}, **FORCED, **kw)
    assert count.input_tokens == m.usage.input_tokens
    assert claude.messages.count_tokens(model=model_name, messages=ASK).input_tokens < count.input_tokens


# ---------------------------------------------------------------- tools


@pytest.mark.parametrize("choice, seed", [({"type": "any"}, 5), ({"type": "tool", "name": "get_weather"}, 3)],
                         ids=["any", "tool"])
def test_a_forced_call_is_a_tool_use_block_that_follows_the_schema(claude, model_name, choice, seed):
    extra = {"temperature": 1.0, "seed": seed}
    m = _create(claude, model_name, ASK, extra=extra, tools=[WEATHER], tool_choice=choice, **FORCED)
    assert m.stop_reason == "tool_use" and m.content and {b.type for b in m.content} == {"tool_use"}
    for block in m.content:
        assert block.name == "get_weather" and block.id.startswith("toolu_")
        jsonschema.validate(block.input, WEATHER["input_schema"])
    _, final = _streamed(claude, model_name, ASK, extra=extra, tools=[WEATHER], tool_choice=choice, **FORCED)
    assert _blocks(final, drop=("id",)) == _blocks(m, drop=("id",)) and final.stop_reason == "tool_use"


def test_disable_parallel_tool_use_gives_one_call(claude, model_name):
    extra = {"temperature": 1.0, "seed": 26}  # (a seed whose answer is two calls, then one without parallel calls)
    two = _create(claude, model_name, ASK, extra=extra, tools=[WEATHER], tool_choice={"type": "any"}, **FORCED)
    assert [b.type for b in two.content] == ["tool_use", "tool_use"] and two.stop_reason == "tool_use"
    m = _create(claude, model_name, ASK, extra=extra, tools=[WEATHER],
                tool_choice={"type": "any", "disable_parallel_tool_use": True}, **FORCED)
    assert [b.type for b in m.content] == ["tool_use"] and m.stop_reason == "tool_use"
    for block in (*two.content, *m.content):
        jsonschema.validate(block.input, WEATHER["input_schema"])


@pytest.mark.parametrize("is_error", [False, True], ids=["result", "error"])
def test_a_tool_result_round_trips_into_the_next_turn(claude, client, model_name, is_error):
    first = _create(claude, model_name, ASK, extra={"temperature": 1.0, "seed": 3}, tools=[WEATHER],
                    tool_choice={"type": "tool", "name": "get_weather"}, **FORCED)
    (call,) = first.content
    result = json.dumps({"forecast": "sunny"})
    m = _create(claude, model_name, [*ASK, {"role": "assistant", "content": _dumped(first)}, {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": call.id, "content": [{"type": "text", "text": result}], "is_error": is_error}]}],
        tools=[WEATHER], tool_choice={"type": "none"})
    chat = _chat(client, model_name, ASK + [
        {"role": "assistant", "tool_calls": [{"id": call.id, "type": "function", "function": {
            "name": call.name, "arguments": json.dumps(call.input)}}]},
        {"role": "tool", "tool_call_id": call.id, "content": ("Error: " if is_error else "") + result}],
        tools=[CHAT_WEATHER], tool_choice="none")
    assert _text(m) == chat.choices[0].message.content and m.stop_reason == "max_tokens"
    assert m.usage.input_tokens == chat.usage.prompt_tokens > first.usage.input_tokens


def test_output_config_format_gives_json_of_the_schema(claude, model_name):
    schema = WEATHER["input_schema"]
    m = _create(claude, model_name, ASK, extra={"temperature": 1.0, "seed": 3}, max_tokens=300,
                output_config={"format": {"type": "json_schema", "schema": schema}})
    assert m.stop_reason == "end_turn"
    jsonschema.validate(json.loads(_text(m)), schema)


# ---------------------------------------------------------------- refusals and errors


IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
USE = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}]}
REFUSED = [
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking", "does not think"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 1}]}, "tools.0.type", "server tools"),
    ({"tools": [WEATHER, {"type": "bash_20250124", "name": "bash"}]}, "tools.1.type", "server tools"),
    ({"mcp_servers": [{"type": "url", "url": "https://x", "name": "x"}]}, "mcp_servers", "MCP"),
    ({"container": "c_1"}, "container", "runs no code"),
    ({"service_tier": "priority"}, "service_tier", "auto"),
    ({"output_config": {"effort": "high"}}, "output_config.effort", "does not reason"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "see"}, IMAGE]}]},
     "messages.0.content.1.type", "images"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                                                                 "data": "x"}}]}]},
     "messages.0.content.0.type", "documents"),
    ({"messages": [*ASK, {"role": "assistant", "content": [{"type": "thinking", "thinking": "x", "signature": "s"}]},
                   *ASK]}, "messages.1.content.0.type", "thinking"),
    ({"messages": [*ASK, USE, {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": [IMAGE]}]}]}, "messages.2.content.0.content.0.type", "images"),
    ({"messages": [*ASK, {"role": "assistant", "content": "The answer is"}]}, "messages.1.role", "prefilling"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope", "content": "1"}]}]},
     "messages.0.content.0.tool_use_id", "no tool_use"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages.0.role", "Input should be"),
    ({"messages": [{"role": "user", "content": "x"}] * 5000}, "messages", "--max-chat-messages"),
    ({"tools": [WEATHER]}, "tool_choice", "--enable-auto-tool-choice"),  # auto, the default: needs the flags
    ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice", "not in tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "tool"}}, "tool_choice.name", "needs the name"),
    ({"tools": [{**WEATHER, "name": "bad name"}], "tool_choice": {"type": "none"}}, "tools.0.name", "letters"),
    ({"tools": [{**WEATHER, "input_schema": {"type": "array"}}], "tool_choice": {"type": "none"}},
     "tools.0.input_schema", "input_schema must be"),
    ({"max_tokens": 0}, "max_tokens", "at least 1"),
    ({"max_tokens": 5000}, "max_tokens", "exceeds the model's context"),
    ({"stop_sequences": [""]}, "stop_sequences", "non-empty"),
    ({"temperature": 1.5}, "temperature", "[0, 1]"),
    ({"top_p": 0}, "top_p", "(0, 1]"),
    ({"top_k": -1}, "top_k", ">= 0"),
    ({"metadata": {"session": "x"}}, "metadata.session", "does not know the field"),
    ({"frequency_penalty": 1}, "frequency_penalty", "does not know the field"),
]


@pytest.mark.parametrize("fields, param, says", REFUSED, ids=[f"{p}:{i}" for i, (_, p, _) in enumerate(REFUSED)])
def test_what_is_not_implemented_is_refused_by_name(claude, model_name, fields, param, says):
    body = {"model": model_name, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], **fields}
    with pytest.raises(anthropic.BadRequestError) as e:  # everything as the body's own fields
        claude.post("/v1/messages", body=body, cast_to=anthropic.types.Message)
    assert e.value.status_code == 400
    error = e.value.body["error"]
    assert e.value.body["type"] == "error" and error["type"] == "invalid_request_error", e.value.body
    assert error["message"].startswith(param), error  # (Anthropic's errors name no param: the message does)
    assert says in error["message"], error


def test_bookkeeping_fields_are_accepted(claude, model_name):
    m = _create(claude, model_name, [{"role": "user", "content": "hi"}], max_tokens=2, metadata={"user_id": "u"},
                service_tier="standard_only", cache_control={"type": "ephemeral"}, thinking={"type": "disabled"},
                inference_geo="us", speed="standard")
    assert m.usage.output_tokens == 2


def test_the_api_key_as_x_api_key_or_bearer(cluster, model_name):
    ask = {"model": model_name, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    with anthropic.Anthropic(base_url=cluster.http_url, auth_token=API_KEY, api_key=None, max_retries=0) as bearer:
        assert bearer.messages.create(**ask).usage.output_tokens == 2  # Authorization: Bearer
    with anthropic.Anthropic(base_url=cluster.http_url, api_key="wrong", max_retries=0) as wrong:
        with pytest.raises(anthropic.AuthenticationError) as e:
            wrong.messages.create(**ask)
        assert e.value.body["error"]["type"] == "authentication_error" and "x-api-key" in e.value.body["error"]["message"]
        with pytest.raises(anthropic.AuthenticationError):
            wrong.messages.count_tokens(model=model_name, messages=ask["messages"])


def test_an_unknown_model_is_404_and_a_wrong_method_405(claude):
    with pytest.raises(anthropic.NotFoundError) as e:
        claude.messages.create(model="claude-x", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    assert e.value.body["error"]["type"] == "not_found_error" and e.value.body["error"]["message"].startswith("model: ")
    with pytest.raises(anthropic.APIStatusError) as e:
        claude.get("/v1/messages", cast_to=anthropic.types.Message)
    assert e.value.status_code == 405 and e.value.body["type"] == "error"


def test_a_client_that_leaves_a_stream_cancels_the_request(cluster, claude, model_name):
    with claude.messages.stream(model=model_name, max_tokens=1500, messages=[{"role": "user", "content": "hello there"}],
                                extra_body=GREEDY) as stream:
        for event in stream:
            if event.type == "content_block_delta":
                break
        running = cluster.stub.GetServerStatus(pb.GetServerStatusRequest(), timeout=10, metadata=AUTH).num_running
    assert running == 1
    wait_until_idle(cluster, "the request ran on after its client left")
