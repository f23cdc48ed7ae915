"""Tool calling through the HTTP API with the official `openai` client, on a scripted engine
(the model's text is given, in chosen pieces): exact messages, exact streamed deltas, finish
reasons, n, parallel_tool_calls, the prompt the tools were rendered into, and the refusals."""

import json

import pytest

openai = pytest.importorskip("openai")

from scheduler_svc.api.tools.plan import ToolSettings  # noqa: E402
from scheduler_svc.core.request import FinishReason  # noqa: E402
from tests.scheduler.api.tools.scripted import AcceptedGrammars, serving  # noqa: E402

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time now"}}
ASK = [{"role": "user", "content": "Weather in Paris, and the time?"}]
PIECES = ["Sure", ".\n<tool", '_call>\n{"name": "get_weather", "argu', 'ments": {"city": "Pa',
          'ris"}}\n</tool_call>\n<tool_call>{"name": "get_time", ', '"arguments": {}}</tool_call>']


@pytest.fixture(scope="module")
def auto(tok):
    with serving(tok, ToolSettings(auto=True, parser="hermes")) as served:
        yield served


@pytest.fixture(scope="module")
def plain(tok):
    with serving(tok, ToolSettings()) as served:
        yield served


def _ask(client, **kw):
    return client.chat.completions.create(model="tiny", messages=kw.pop("messages", ASK),
                                          tools=kw.pop("tools", [WEATHER, TIME]), **kw)


def test_collected_calls(auto, tok):
    client, engine = auto
    engine.script, engine.finish = [PIECES], FinishReason.EOS
    r = _ask(client)
    message = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and message.content == "Sure."
    assert [(c.type, c.function.name, c.function.arguments) for c in message.tool_calls] == [
        ("function", "get_weather", '{"city": "Paris"}'), ("function", "get_time", "{}")]
    assert all(c.id.startswith("call_") and len(c.id) == 29 for c in message.tool_calls)
    assert len({c.id for c in message.tool_calls}) == 2
    prompt = tok.decode(engine.prompts[-1], skip_special_tokens=False)
    assert "<tools>\n" + '{"type": "function", "function": {"name": "get_weather"' in prompt
    assert prompt.endswith("Weather in Paris, and the time?<|end|>\n<|assistant|>\n")


def test_only_calls_is_null_content_and_one_call_without_parallel(auto):
    client, engine = auto
    engine.script = [["<tool"] + PIECES[2:]]
    r = _ask(client, parallel_tool_calls=False)
    message = r.choices[0].message
    assert message.content is None and [c.function.name for c in message.tool_calls] == ["get_weather"]


def test_streamed_deltas_are_openais(auto):
    client, engine = auto
    engine.script, engine.finish = [PIECES], FinishReason.EOS
    chunks = list(_ask(client, stream=True))
    deltas = [c.choices[0].delta.model_dump(exclude_none=True) for c in chunks]
    ids = [d["tool_calls"][0]["id"] for d in deltas if "id" in d.get("tool_calls", [{}])[0]]
    assert deltas == [
        {"role": "assistant", "content": ""}, {"content": "Sure"}, {"content": "."},
        {"tool_calls": [{"index": 0, "id": ids[0], "type": "function", "function": {"name": "get_weather", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Pa'}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": 'ris"}'}}]},
        {"tool_calls": [{"index": 1, "id": ids[1], "type": "function", "function": {"name": "get_time", "arguments": ""}}]},
        {"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}]
    assert [c.choices[0].finish_reason for c in chunks] == [None] * 7 + ["tool_calls"]


def test_the_clients_stream_helper_adds_them_up(auto):
    client, engine = auto
    engine.script = [PIECES, ["No tools needed: <tool", "_call is a tag."]]
    with client.chat.completions.stream(model="tiny", messages=ASK, tools=[WEATHER, TIME], n=2) as stream:
        final = stream.get_final_completion()
    calls, text = final.choices
    assert [(c.function.name, c.function.arguments) for c in calls.message.tool_calls] == [
        ("get_weather", '{"city": "Paris"}'), ("get_time", "{}")]
    assert calls.finish_reason == "tool_calls" and calls.message.content == "Sure."
    assert text.message.content == "No tools needed: <tool_call is a tag." and not text.message.tool_calls
    assert text.finish_reason == "stop"


def test_cut_by_max_tokens_stays_length(auto):
    client, engine = auto
    engine.script, engine.finish = [PIECES[:4]], FinishReason.LENGTH
    choice = _ask(client).choices[0]
    assert choice.finish_reason == "length"
    assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls] == [("get_weather", '{"city": "Pa')]
    engine.finish = FinishReason.EOS


def test_none_leaves_the_text_as_it_is(plain):
    client, engine = plain
    engine.script = [PIECES]
    r = _ask(client, tool_choice="none")
    assert r.choices[0].message.content == "".join(PIECES) and not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "stop"


def test_a_conversation_with_calls_and_results(plain, tok):
    client, engine = plain
    engine.script = [["It is 20C."]]
    messages = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_9", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_9", "content": "20C"}]
    r = client.chat.completions.create(model="tiny", messages=messages)  # no tools: history only
    assert r.choices[0].message.content == "It is 20C."
    prompt = tok.decode(engine.prompts[-1], skip_special_tokens=False)
    assert ('<|assistant|>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|end|>\n'
            "<|user|>\n<tool_response>\n20C\n</tool_response><|end|>\n<|assistant|>\n") in prompt
    assert "# Tools" not in prompt


def test_forced_choices_are_the_grammars_output(tok):
    grammars = AcceptedGrammars()
    with serving(tok, ToolSettings(), grammars) as (client, engine):  # no flag needed
        engine.script = [['[{"name": "get_time", "parameters": {}}, ', '{"name": "get_weather", "param',
                          'eters": {"city": "Rome"}}]']]
        r = _ask(client, tool_choice="required")
        assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content is None
        assert [(c.function.name, c.function.arguments) for c in r.choices[0].message.tool_calls] == [
            ("get_time", "{}"), ("get_weather", '{"city": "Rome"}')]
        assert grammars.checked[-1].param == "tool_choice"
        engine.script = [['{"city"', ': "Oslo"}']]
        chunks = list(_ask(client, tool_choice={"type": "function", "function": {"name": "get_weather"}}, stream=True))
        calls = [t for c in chunks for t in c.choices[0].delta.tool_calls or []]
        assert calls[0].function.name == "get_weather" and calls[0].id.startswith("call_")
        assert "".join(t.function.arguments for t in calls) == '{"city": "Oslo"}'
        assert chunks[-1].choices[0].finish_reason == "stop"  # a named function: as OpenAI answers it
        assert json.loads(grammars.checked[-1].value) == WEATHER["function"]["parameters"]


def test_llama3_json_server(tok):
    with serving(tok, ToolSettings(auto=True, parser="llama3_json")) as (client, engine):
        engine.script = [['{"name": "get_weather", "param', 'eters": {"city": "Lima"}}; {"name": "get_time", ',
                          '"parameters": {}}']]
        r = _ask(client)
        assert [(c.function.name, c.function.arguments) for c in r.choices[0].message.tool_calls] == [
            ("get_weather", '{"city": "Lima"}'), ("get_time", "{}")]
        assert r.choices[0].message.content is None and r.choices[0].finish_reason == "tool_calls"
        prompt = tok.decode(engine.prompts[-1], skip_special_tokens=False)
        assert "Given the following functions, please respond with a JSON for a function call" in prompt
        engine.script = [["The answer ", "is 42."]]
        assert _ask(client).choices[0].message.content == "The answer is 42."


def test_tokenize_takes_no_tool_turns(plain):
    client, _ = plain
    turns = ASK + [{"role": "tool", "tool_call_id": "c", "content": "x"}]
    root = client.with_options(base_url="http://testserver")
    assert root.post("/tokenize", body={"messages": ASK}, cast_to=object)["count"] > 0
    with pytest.raises(openai.BadRequestError) as e:
        root.post("/tokenize", body={"messages": turns}, cast_to=object)
    assert e.value.body["param"] == "messages"


@pytest.mark.parametrize("kw, param", [
    ({}, "tool_choice"),  # auto by default: needs --enable-auto-tool-choice
    ({"tools": [{"type": "function", "function": {"name": "get weather"}}], "tool_choice": "none"}, "tools.0.function.name"),
    ({"tools": [{"type": "retrieval"}], "tool_choice": "none"}, "tools.0.type"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"messages": ASK + [{"role": "tool", "content": "x"}], "tool_choice": "none"}, "messages.1.tool_call_id"),
    ({"extra_body": {"functions": [TIME["function"]]}, "tool_choice": "none"}, "functions"),
])
def test_refused_with_400_naming_the_field(plain, kw, param):
    client, _ = plain
    with pytest.raises(openai.BadRequestError) as e:
        _ask(client, **kw)
    assert e.value.status_code == 400 and e.value.body["param"] == param, e.value.body
