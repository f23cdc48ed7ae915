"""Tool calling on the built-in model, SmolLM2-135M-Instruct (its template renders no tools: they
are described in its system turn, hermes style). The model rarely calls a tool by itself, so
these tests check the responses' shape and the prompt the tools went into; the exact calls are
test_tool_calls.py's (a model whose output is known)."""

import json

import pytest

openai = pytest.importorskip("openai")

from tests.integration.http.tools.conftest import detokenize  # noqa: E402

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris? Use the get_weather tool."}]


def _model(client):
    return client.models.list().data[0].id


def _check_message(choice):
    """A message as OpenAI's: content text, or null with calls of the request's tools."""
    message = choice.message
    assert message.role == "assistant" and choice.finish_reason in ("stop", "length", "tool_calls")
    if message.tool_calls:
        assert choice.finish_reason in ("tool_calls", "length")
        for call in message.tool_calls:
            assert call.id.startswith("call_") and call.type == "function" and call.function.name == "get_weather"
            assert isinstance(call.function.arguments, str)
    else:
        assert isinstance(message.content, str) and choice.finish_reason != "tool_calls"


def test_tools_go_into_the_system_turn(builtin, builtin_cluster):
    r = builtin.chat.completions.create(model=_model(builtin), messages=ASK, tools=[WEATHER], temperature=0,
                                        max_tokens=6, extra_body={"return_token_ids": True})
    _check_message(r.choices[0])
    assert r.object == "chat.completion" and r.usage.completion_tokens <= 6
    prompt = detokenize(builtin_cluster, r.prompt_token_ids)
    assert prompt.startswith("<|im_start|>system\n# Tools\n\nYou may call one or more functions")
    assert json.dumps(WEATHER) in prompt and prompt.endswith(
        "</tool_call><|im_end|>\n<|im_start|>user\nWhat is the weather in Paris? Use the get_weather tool."
        "<|im_end|>\n<|im_start|>assistant\n")


def test_streamed_shape(builtin):
    chunks = list(builtin.chat.completions.create(model=_model(builtin), messages=ASK, tools=[WEATHER],
                                                  temperature=0, max_tokens=6, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    finish = [c.choices[0].finish_reason for c in chunks]
    assert finish[-1] in ("stop", "length", "tool_calls") and not any(finish[:-1])
    calls = [t for c in chunks for t in c.choices[0].delta.tool_calls or []]
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert calls or content  # one or the other came
    assert "<tool_call>" not in content or not calls


def test_a_turn_after_a_tool_result(builtin):
    messages = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"temperature_c": 21, "sky": "clear"})}]
    r = builtin.chat.completions.create(model=_model(builtin), messages=messages, tools=[WEATHER],
                                        temperature=0, max_tokens=6)
    _check_message(r.choices[0])
    none = builtin.chat.completions.create(model=_model(builtin), messages=messages, tools=[WEATHER],
                                           tool_choice="none", temperature=0, max_tokens=6)
    assert isinstance(none.choices[0].message.content, str) and not none.choices[0].message.tool_calls


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_choices_follow_the_schema(builtin, choice):
    """The grammar of tool_choice "required" or a named function (structured outputs); while they
    are not applied: refused naming tool_choice, never run unconstrained."""
    try:
        r = builtin.chat.completions.create(model=_model(builtin), messages=ASK, tools=[WEATHER],
                                            tool_choice=choice, temperature=0, max_tokens=40)
    except openai.BadRequestError as e:
        assert e.body["param"] == "tool_choice" and "structured outputs" in e.body["message"], e.body
        return
    jsonschema = pytest.importorskip("jsonschema")
    choice_out = r.choices[0]
    assert choice_out.finish_reason in (("tool_calls" if choice == "required" else "stop"), "length")
    for call in choice_out.message.tool_calls:
        assert call.function.name == "get_weather"
        if choice_out.finish_reason != "length":
            jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
