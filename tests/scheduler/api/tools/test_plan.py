"""A chat's tool fields: each refusal names its field, the choices' plans, and the JSON schemas
the required and named choices imply (checked with jsonschema against outputs they must
accept and refuse)."""

import json

import pytest

from scheduler_svc.api.http.schemas import ChatCompletionRequest
from scheduler_svc.api.tools import plan as tool_plan
from scheduler_svc.api.tools.forced import named_schema, required_schema
from scheduler_svc.api.tools.plan import ToolPlan, ToolSettings, plan_tools, prepare_chat
from scheduler_svc.api.tools.render import ToolChatPrompt
from scheduler_svc.api.validation import SizeLimits
from scheduler_svc.config import TOOL_CALL_PARSERS
from scheduler_svc.messages import RequestError

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "days": {"type": "integer", "minimum": 1}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time"}}
USER = [{"role": "user", "content": "Weather in Paris?"}]
AUTO = ToolSettings(auto=True, parser="hermes")


def _plan(settings=AUTO, sizes=SizeLimits(), **fields):
    body = ChatCompletionRequest.model_validate({"messages": USER, **fields})
    return plan_tools(body, settings, sizes)


def _refused(param, settings=AUTO, sizes=SizeLimits(), **fields) -> str:
    with pytest.raises(RequestError) as e:
        _plan(settings, sizes, **fields)
    assert (e.value.code, e.value.param) == ("INVALID_ARGUMENT", param), e.value.message
    return e.value.message


def test_parser_names_match_the_flag():
    assert tuple(tool_plan.FORMATS) == TOOL_CALL_PARSERS


def test_no_tools_is_no_plan():
    assert _plan() is None
    assert _plan(parallel_tool_calls=False) is None  # means nothing alone


def test_choices():
    assert _plan(tools=[WEATHER]).choice == "auto"  # the default with tools
    assert _plan(tools=[WEATHER], tool_choice="auto").names == frozenset({"get_weather"})
    none = _plan(ToolSettings(), tools=[WEATHER, TIME], tool_choice="none")
    assert none.choice == "none" and none.new_parser() is None and none.outputs(1) is None
    assert _plan(ToolSettings(auto=True, parser="llama3_json"), tools=[TIME]).format.name == "llama3_json"
    assert _plan(tools=[TIME], parallel_tool_calls=False).parallel is False


def test_auto_needs_the_flags():
    message = _refused("tool_choice", ToolSettings(), tools=[WEATHER])
    assert "--enable-auto-tool-choice" in message and '"none"' in message
    _refused("tool_choice", ToolSettings(), tools=[WEATHER], tool_choice="auto")


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_choices_are_structured_outputs(choice):
    body = ChatCompletionRequest.model_validate({"messages": USER, "tools": [WEATHER, TIME], "tool_choice": choice})
    _, raw, plan = prepare_chat(body, ToolSettings(), SizeLimits())  # (no flag needed)
    assert (raw.constraint.kind, raw.constraint.param) == ("json", "tool_choice")
    assert json.loads(raw.constraint.value) == plan.schema()
    body = ChatCompletionRequest.model_validate({"messages": USER, "tools": [WEATHER], "tool_choice": choice,
                                                 "response_format": {"type": "json_object"}})
    with pytest.raises(RequestError) as e:
        prepare_chat(body, ToolSettings(), SizeLimits())
    assert e.value.param == "tool_choice" and "response_format" in e.value.message


@pytest.mark.parametrize("fields, param, words", [
    ({"tool_choice": "auto"}, "tool_choice", "needs tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "'nope'"),
    ({"tools": [WEATHER] * 2}, "tools.1.function.name", "unique"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools.0.function.name", "letters"),
    ({"tools": [{"type": "function", "function": {"name": "x" * 65}}]}, "tools.0.function.name", "64"),
    ({"tools": [TIME, {"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
     "tools.1.function.parameters", '"object"'),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "p": [[[[[[[[[[
        [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}}}]}, "tools.0.function.parameters", "deeper"),
    ({"tools": [TIME] * 129}, "tools", "limit is 128"),
])
def test_refusals_name_the_field(fields, param, words):
    assert words in _refused(param, **fields)


@pytest.mark.parametrize("messages, param", [
    ([{"role": "tool", "content": "20C"}], "messages.0.tool_call_id"),
    ([{"role": "user", "content": "x", "tool_call_id": "c1"}], "messages.0.tool_call_id"),
    (USER + [{"role": "user", "tool_calls": [{"id": "c", "type": "function",
                                              "function": {"name": "f", "arguments": "{}"}}]}], "messages.1.tool_calls"),
])
def test_tool_turns_where_they_belong(messages, param):
    body = ChatCompletionRequest.model_validate({"messages": messages})
    with pytest.raises(RequestError) as e:
        plan_tools(body, AUTO, SizeLimits())
    assert e.value.param == param


def test_tools_count_towards_the_prompt_bytes():
    big = {"type": "function", "function": {"name": "f", "description": "x" * 2000}}
    assert "--max-prompt-bytes" in _refused("tools", sizes=SizeLimits(max_prompt_bytes=1000), tools=[big])
    _refused("messages", sizes=SizeLimits(max_prompt_bytes=2100), tools=[big],
             messages=USER + [{"role": "assistant", "content": "y" * 100}])


def test_a_chat_with_tool_turns_is_rendered_with_them():
    messages = USER + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "20C"}]}]
    body = ChatCompletionRequest.model_validate({"messages": messages, "max_tokens": 5})
    prompt, raw, plan = prepare_chat(body, ToolSettings(), SizeLimits())
    assert isinstance(prompt, ToolChatPrompt) and plan.choice == "none" and raw.max_tokens == 5
    assert prompt.messages[1].tool_calls == (("call_1", "get_weather", '{"city": "Paris"}'),)
    assert (prompt.messages[2].role, prompt.messages[2].content, prompt.messages[2].tool_call_id) == ("tool", "20C", "call_1")
    plain, _, none = prepare_chat(ChatCompletionRequest.model_validate({"messages": USER}), AUTO, SizeLimits())
    assert none is None and not isinstance(plain, ToolChatPrompt)


def test_named_schema_is_the_functions_parameters():
    jsonschema = pytest.importorskip("jsonschema")
    schema = named_schema(WEATHER["function"])
    jsonschema.validate({"city": "Paris", "days": 2}, schema)
    for bad in ({"days": 2}, {"city": "Paris", "extra": 1}, {"city": 3}, []):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    assert named_schema(TIME["function"]) == {"type": "object", "properties": {}}


def test_required_schema_is_an_array_of_calls():
    jsonschema = pytest.importorskip("jsonschema")
    functions = [WEATHER["function"], TIME["function"]]
    schema = required_schema(functions, parallel=True)
    jsonschema.Draft202012Validator.check_schema(schema)
    good = [{"name": "get_weather", "parameters": {"city": "Rome"}}, {"name": "get_time", "parameters": {}}]
    jsonschema.validate(good, schema)
    for bad in ([], [{"name": "get_weather", "parameters": {}}], [{"name": "nope", "parameters": {}}],
                [{"name": "get_time"}], {"name": "get_time", "parameters": {}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    one = required_schema(functions, parallel=False)
    jsonschema.validate(good[:1], one)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(good, one)
    assert required_schema([TIME["function"]], True)["items"]["properties"]["name"] == {"type": "string", "enum": ["get_time"]}


def test_plans_give_their_schema_and_parser():
    functions = (WEATHER["function"], TIME["function"])
    named = ToolPlan("named", functions, True, "get_time")
    assert named.schema() == {"type": "object", "properties": {}} and named.new_parser().name == "get_time"
    assert ToolPlan("required", functions, False).schema()["maxItems"] == 1
    assert ToolPlan("auto", functions, True).schema() is None
