"""The Responses API's function calls under tool_choice "auto" (the hermes parser), with the
`openai` client, on the chain model: its greedy output is CALL_PIECES (content, then two hermes
calls), so the output items and their events are known exactly; and a streamed answer and a
forced call of the built-in model (SmolLM2-135M-Instruct)."""

import json

import pytest

openai = pytest.importorskip("openai")

from tests.integration.http.tools.conftest import CALL_PIECES  # noqa: E402

WEATHER = {"type": "function", "name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "array"}}, "required": ["city"]}}
TIME = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}
CALLS = [("get_weather", '{"city": "Paris", "days": [1, 2]}'), ("get_time", '{"tz": "Europe/Paris"}')]


def _create(chain, **kw):
    kw = {"input": "Weather and time in Paris?", "tools": [WEATHER, TIME], "temperature": 0,
          "max_output_tokens": 32, **kw}
    return chain.responses.create(model=chain.models.list().data[0].id, **kw)


def _shape(output) -> list:
    return [(o.type, o.content[0].text) if o.type == "message" else (o.type, o.name, o.arguments) for o in output]


def test_content_then_two_calls(chain):
    r = _create(chain)
    assert r.status == "completed" and r.usage.output_tokens == len(CALL_PIECES) + 1  # the pieces and EOS
    assert _shape(r.output) == [("message", "I will check."), *[("function_call", *c) for c in CALLS]]
    assert r.output_text == "I will check." and len({o.call_id for o in r.output[1:]}) == 2
    assert all(o.status == "completed" for o in r.output)


def test_the_stream_adds_up_to_the_same_items(chain):
    events = list(_create(chain, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert _shape(done) == _shape(events[-1].response.output) == [
        ("message", "I will check."), *[("function_call", *c) for c in CALLS]]
    assert events[-1].type == "response.completed"
    for index, (name, arguments) in enumerate(CALLS, start=1):
        deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta" and e.output_index == index]
        assert "".join(deltas) == arguments
    added = [e.output_index for e in events if e.type == "response.output_item.added"]
    assert added == [0, 1, 2]
    # each item is closed before the next opens
    order = [(e.type, e.output_index) for e in events if e.type.startswith("response.output_item.")]
    assert order == [("response.output_item.added", 0), ("response.output_item.done", 0),
                     ("response.output_item.added", 1), ("response.output_item.done", 1),
                     ("response.output_item.added", 2), ("response.output_item.done", 2)]
    with chain.responses.stream(model=chain.models.list().data[0].id, input="Weather?", tools=[WEATHER, TIME],
                                temperature=0, max_output_tokens=32) as stream:
        final = stream.get_final_response()
    assert _shape(final.output) == _shape(events[-1].response.output)


def test_one_call_without_parallel_calls(chain):
    r = _create(chain, parallel_tool_calls=False)
    assert _shape(r.output) == [("message", "I will check."), ("function_call", *CALLS[0])]


def test_cut_by_max_output_tokens(chain):
    r = _create(chain, max_output_tokens=4)  # the first call's name, not its arguments' end
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert _shape(r.output) == [("message", "I will check."), ("function_call", "get_weather", '{"ci')]
    assert [o.status for o in r.output] == ["completed", "incomplete"]


def test_none_is_the_text_as_written(chain):
    r = _create(chain, tool_choice="none")
    assert _shape(r.output) == [("message", "".join(CALL_PIECES))] and r.status == "completed"


def test_the_builtin_model_streams_an_answer(builtin):
    model = builtin.models.list().data[0].id
    kw = {"model": model, "instructions": "Answer in one sentence.", "input": "What is the capital of France?",
          "temperature": 0, "max_output_tokens": 24}
    collected = builtin.responses.create(**kw)
    events = list(builtin.responses.create(stream=True, **kw))
    assert events[-1].type == f"response.{collected.status}" and collected.status in ("completed", "incomplete")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == collected.output_text == events[-1].response.output_text and text.strip()
    assert events[-1].response.usage.output_tokens == collected.usage.output_tokens <= 24


def test_the_builtin_model_calls_a_named_function(builtin):
    weather = {"type": "function", "name": "get_weather", "strict": True, "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
        "additionalProperties": False}}
    r = builtin.responses.create(model=builtin.models.list().data[0].id, input="What is the weather in Paris?",
                                 tools=[weather], tool_choice={"type": "function", "name": "get_weather"},
                                 temperature=0, max_output_tokens=40)
    assert r.status == "completed" and [o.type for o in r.output] == ["function_call"]
    assert isinstance(json.loads(r.output[0].arguments)["city"], str)
