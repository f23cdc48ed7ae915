"""Tool calling end to end with the `openai` client: both real services on the chain model,
whose greedy output is CALL_PIECES (content, then two hermes calls), token by token through the
executor, the scheduler's detokenizer and the HTTP door's parser."""

import json

import pytest

openai = pytest.importorskip("openai")

from tests.integration.http.tools.conftest import CALL_PIECES, detokenize  # noqa: E402

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather forecast", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "array"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"type": "string"}}}}}
ASK = [{"role": "user", "content": "What will the weather be in Paris, and what time is it there?"}]
CALLS = [("get_weather", '{"city": "Paris", "days": [1, 2]}'), ("get_time", '{"tz": "Europe/Paris"}')]


def _ask(client, **kw):
    kw = {"messages": ASK, "tools": [WEATHER, TIME], "temperature": 0, "max_tokens": 32, **kw}
    return client.chat.completions.create(model=client.models.list().data[0].id, **kw)


def test_the_calls_collected(chain):
    r = _ask(chain)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "I will check."
    assert [(c.type, c.function.name, c.function.arguments) for c in choice.message.tool_calls] == [
        ("function", *call) for call in CALLS]
    assert [json.loads(c.function.arguments) for c in choice.message.tool_calls][0] == {"city": "Paris", "days": [1, 2]}
    assert r.usage.completion_tokens == len(CALL_PIECES) + 1  # the pieces and EOS


def test_the_calls_streamed(chain):
    chunks = list(_ask(chain, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(CALL_PIECES) + 1
    deltas = [c.choices[0].delta for c in chunks[:-1]]
    assert deltas[0].role == "assistant"
    assert "".join(d.content or "" for d in deltas) == "I will check."
    calls, firsts = {}, {}
    for d in deltas:
        for call in d.tool_calls or []:
            if call.index not in calls:  # the first delta of a call: id, type and name
                assert call.id.startswith("call_") and call.type == "function" and call.function.name
                firsts[call.index] = call
                calls[call.index] = [call.function.name, call.function.arguments]
            else:  # then only pieces of its arguments
                assert call.id is None and call.function.name is None
                calls[call.index][1] += call.function.arguments
    assert [tuple(calls[i]) for i in sorted(calls)] == CALLS
    assert len({f.id for f in firsts.values()}) == 2
    assert not any("<tool" in (d.content or "") for d in deltas)
    assert [c.choices[0].finish_reason for c in chunks[:-1]][-1] == "tool_calls"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-2])


def test_the_clients_stream_helper(chain):
    with chain.chat.completions.stream(model=chain.models.list().data[0].id, messages=ASK, tools=[WEATHER, TIME],
                                       temperature=0, max_tokens=32, n=2) as stream:
        final = stream.get_final_completion()
    for choice in final.choices:
        assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls] == CALLS
        assert choice.finish_reason == "tool_calls"


def test_one_call_without_parallel_calls(chain):
    message = _ask(chain, parallel_tool_calls=False).choices[0].message
    assert [(c.function.name, c.function.arguments) for c in message.tool_calls] == CALLS[:1]


def test_none_is_the_text_as_written(chain):
    r = _ask(chain, tool_choice="none")
    assert r.choices[0].message.content == "".join(CALL_PIECES) and not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "stop"


def test_cut_by_max_tokens(chain):
    choice = _ask(chain, max_tokens=4).choices[0]  # the first call's name, not its arguments' end
    assert choice.finish_reason == "length" and choice.message.content == "I will check."
    assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls] == [("get_weather", '{"ci')]


def test_a_turn_after_the_results(chain, chain_cluster):
    first = _ask(chain).choices[0].message
    messages = ASK + [first.model_dump(exclude_none=True)] + [
        {"role": "tool", "tool_call_id": c.id, "content": json.dumps({"ok": True})} for c in first.tool_calls]
    r = _ask(chain, messages=messages, extra_body={"return_token_ids": True})
    assert r.choices[0].finish_reason == "tool_calls"  # (this model always calls)
    prompt = detokenize(chain_cluster, r.prompt_token_ids)
    assert '<|assistant|>\nI will check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", ' in prompt
    assert '<|user|>\n<tool_response>\n{"ok": true}\n</tool_response>\n<tool_response>\n{"ok": true}\n</tool_response>' in prompt


def test_a_server_without_the_flags_refuses_auto(cluster, client, model_name):
    """The package's plain cluster has no tool flags: tools (auto by default) are refused."""
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_name, messages=ASK, tools=[TIME])
    assert e.value.body["param"] == "tool_choice" and "--enable-auto-tool-choice" in e.value.body["message"]
    r = client.chat.completions.create(model=model_name, messages=ASK, tools=[TIME], tool_choice="none",
                                       max_tokens=3)
    assert r.choices[0].finish_reason in ("stop", "length") and not r.choices[0].message.tool_calls
