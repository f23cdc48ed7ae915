"""OpenAI's Responses API (POST /v1/responses) on both real services (the package's cluster: a
tiny random llama, no tool flags), driven with the `openai` package's `responses` resource and
compared with chat completions of the same messages on the same engine (greedy: token-exact)."""

import json

import pytest

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

from protos.llmserve.v1 import llmserve_pb2 as pb  # noqa: E402
from tests.integration.http.conftest import AUTH, wait_until_idle  # noqa: E402

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather forecast", "strict": True,
           "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "days"],
                          "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
                                         "days": {"type": "integer", "minimum": 1, "maximum": 7}}}}
CHAT_WEATHER = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0,
                                                                              "maximum": 99}}}
CUT = 8  # max_output_tokens where the greedy answer is cut (checked against chat's "length")
# forced calls sample at temperature 1 with a seed whose call ends within the token budget (a
# random model fills the whitespace JSON allows: at temperature 0 it never closes the object)
FORCED = {"temperature": 1.0, "max_output_tokens": 300}
NAMED = {"type": "function", "name": "get_weather"}


def _create(client, model_name, **kw):
    return client.responses.create(model=model_name, **{"temperature": 0, **kw})


def _chat(client, model_name, messages, **kw):
    return client.chat.completions.create(model=model_name, messages=messages, temperature=0, **kw)


def _refused(call) -> dict:
    with pytest.raises(openai.BadRequestError) as e:
        call()
    assert e.value.status_code == 400, e.value.body
    return e.value.body


# ---------------------------------------------------------------- text


def test_text_collected_equals_chat_and_is_cut_by_max_output_tokens(client, model_name):
    chat = _chat(client, model_name, [{"role": "user", "content": "hello there"}], max_tokens=CUT)
    assert chat.choices[0].finish_reason == "length"  # the greedy answer runs past CUT tokens
    r = _create(client, model_name, input="hello there", max_output_tokens=CUT)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == model_name
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output_text == chat.choices[0].message.content
    assert (r.usage.input_tokens, r.usage.output_tokens, r.usage.total_tokens) == (
        chat.usage.prompt_tokens, CUT, chat.usage.prompt_tokens + CUT)
    (message,) = r.output
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert message.status == "incomplete" and message.content[0].type == "output_text"
    assert message.content[0].annotations == [] and r.error is None and r.store is True  # kept by default


def test_streamed_events_add_up_to_the_collected_response(client, model_name):
    collected = _create(client, model_name, input="hello there", max_output_tokens=CUT)
    events = list(_create(client, model_name, input="hello there", max_output_tokens=CUT, stream=True))
    types = [e.type for e in events]
    assert types[:5] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added", "response.output_text.delta"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.incomplete"]
    assert set(types[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == collected.output_text == events[-4].text == events[-1].response.output_text
    item_id = events[2].item.id
    assert all(e.item_id == item_id for e in events[3:-2]) and events[-2].item.status == "incomplete"
    final = events[-1].response
    assert final.id == events[0].response.id and events[0].response.status == "in_progress"
    assert final.usage.output_tokens == CUT and final.incomplete_details.reason == "max_output_tokens"


def test_instructions_and_items_render_as_the_same_chat(client, model_name):
    first = _create(client, model_name, input="hi", max_output_tokens=4)
    items = [{"role": "user", "content": "hi"}, *[o.model_dump(exclude_none=True) for o in first.output],
             {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
             {"role": "user", "content": [{"type": "input_text", "text": "how "}, {"type": "input_text", "text": "are you"}]}]
    r = _create(client, model_name, instructions="You are terse.", input=items, max_output_tokens=CUT)
    chat = _chat(client, model_name, [
        {"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": first.output_text}, {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "how are you"}], max_tokens=CUT)
    assert r.output_text == chat.choices[0].message.content and r.instructions == "You are terse."
    assert (r.usage.input_tokens, r.usage.output_tokens) == (chat.usage.prompt_tokens, chat.usage.completion_tokens)


def test_logprobs_when_included(client, model_name):
    r = _create(client, model_name, input="hello there", max_output_tokens=CUT, top_logprobs=2,
                include=["message.output_text.logprobs"])
    logprobs = r.output[0].content[0].logprobs
    assert len(logprobs) == CUT and all(len(lp.top_logprobs) == 2 and lp.logprob <= 0 for lp in logprobs)
    assert logprobs[0].logprob == pytest.approx(logprobs[0].top_logprobs[0].logprob)  # greedy: the likeliest


# ---------------------------------------------------------------- structured outputs


def test_text_format_json_schema_gives_valid_json(client, model_name):
    r = client.responses.create(model=model_name, input="Describe a person.", max_output_tokens=200, temperature=1.0,
                                text={"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}},
                                extra_body={"seed": 3})
    assert r.status == "completed" and r.text.format.type == "json_schema"
    jsonschema.validate(json.loads(r.output_text), PERSON)


def test_the_sdks_parse_and_stream_helpers(client, model_name):
    pydantic = pytest.importorskip("pydantic")

    class Person(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=8)
        age: int = pydantic.Field(ge=0, le=99)

    r = client.responses.parse(model=model_name, input="Describe a person.", max_output_tokens=200,
                               temperature=1.0, text_format=Person, extra_body={"seed": 1})
    assert r.status == "completed" and isinstance(r.output_parsed, Person)
    with client.responses.stream(model=model_name, input="Describe a person.", max_output_tokens=200,
                                 temperature=1.0, text_format=Person, extra_body={"seed": 1}) as stream:
        final = stream.get_final_response()
    assert final.output_text == r.output_text and final.output_parsed == r.output_parsed


# ---------------------------------------------------------------- function tools


@pytest.mark.parametrize("choice, seed", [("required", 6), (NAMED, 3)], ids=["required", "named"])
def test_forced_function_call_follows_the_schema(client, model_name, choice, seed):
    r = _create(client, model_name, input="Weather in Paris?", tools=[WEATHER], tool_choice=choice,
                extra_body={"seed": seed}, **FORCED)
    assert r.status == "completed" and r.output
    assert r.tool_choice == "required" if choice == "required" else r.tool_choice.name == "get_weather"
    for call in r.output:
        assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
        assert call.call_id.startswith("call_") and call.id.startswith("fc_")
        jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])


def test_streamed_function_call(client, model_name):
    kw = {"input": "Weather in Paris?", "tools": [WEATHER], "tool_choice": NAMED, "extra_body": {"seed": 3}, **FORCED}
    collected = _create(client, model_name, **kw)
    events = list(_create(client, model_name, stream=True, **kw))
    types = [e.type for e in events]
    assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert types[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert set(types[3:-3]) == {"response.function_call_arguments.delta"}
    arguments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert arguments == events[-3].arguments == collected.output[0].arguments
    assert events[2].item.name == "get_weather" and events[-2].item.arguments == arguments
    assert events[-1].response.output[0].call_id == events[2].item.call_id


def test_function_call_output_round_trips_into_the_next_turn(client, model_name):
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    first = _create(client, model_name, input=ask, tools=[WEATHER], tool_choice=NAMED, extra_body={"seed": 3},
                    **FORCED)
    (call,) = first.output
    assert first.status == "completed" and json.loads(call.arguments)["city"] in ("Paris", "Rome", "Oslo")
    result = json.dumps({"forecast": "sunny"})
    r = _create(client, model_name, tools=[WEATHER], tool_choice="none", max_output_tokens=CUT, input=[
        *ask, call.model_dump(exclude_none=True), {"type": "function_call_output", "call_id": call.call_id, "output": result}])
    chat = _chat(client, model_name, ask + [
        {"role": "assistant", "tool_calls": [{"id": call.call_id, "type": "function",
                                              "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": result}],
        tools=[CHAT_WEATHER], tool_choice="none", max_tokens=CUT)
    assert r.output_text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens > first.usage.input_tokens


# ---------------------------------------------------------------- refusals


REFUSED = [
    ({"previous_response_id": "resp_123"}, "previous_response_id", "not found"),  # never kept
    ({"conversation": "conv_123"}, "conversation", "keeps no conversations"),
    ({"background": True}, "background", "background"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt", "stored prompt"),
    ({"tools": [{"type": "web_search"}]}, "tools.0.type", "built-in tools"),
    ({"tools": [WEATHER, {"type": "file_search", "vector_store_ids": ["vs_1"]}]}, "tools.1.type", "built-in tools"),
    ({"tools": [{"type": "computer_use_preview", "display_width": 8, "display_height": 8, "environment": "linux"}]},
     "tools.0.type", "built-in tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "web_search_preview"}}, "tool_choice", "not supported"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "see"},
                                            {"type": "input_image", "image_url": "https://x/y.png"}]}]},
     "input.0.content.1.type", "images"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file_1"}]}]},
     "input.0.content.0.type", "files"),
    ({"input": [{"type": "reasoning", "id": "rs_1", "summary": []}]}, "input.0.type", "reasoning"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input.0.type", "item references"),
    ({"reasoning": {"effort": "high"}}, "reasoning.effort", "does not reason"),
    ({"reasoning": {"summary": "auto"}}, "reasoning.summary", "does not reason"),
    ({"truncation": "auto"}, "truncation", "never cut"),
    ({"include": ["reasoning.encrypted_content"]}, "include.0", "produces only"),
    ({"include": ["message.output_text.logprobs", "file_search_call.results"]}, "include.1", "produces only"),
    ({"top_logprobs": 3}, "top_logprobs", "needs include"),
    ({"max_tool_calls": 2}, "max_tool_calls", "max_tool_calls"),
    ({"text": {"verbosity": "low"}}, "text.verbosity", "verbosity"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema", "needs a schema"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object", "unevaluatedProperties": False}}}},
     "text.format.schema", "unevaluatedProperties"),
    ({"tools": [WEATHER]}, "tool_choice", "--enable-auto-tool-choice"),  # auto, the default: needs the flags
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice", "not in tools"),
    ({"tools": [{**WEATHER, "name": "bad name"}], "tool_choice": "none"}, "tools.0.name", "letters"),
    ({"tools": [WEATHER], "tool_choice": "required", "include": ["message.output_text.logprobs"]}, "include", "tools"),
    ({"input": [{"type": "function_call_output", "call_id": "call_x", "output": "1"}]}, "input.0.call_id", "no function_call"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input.0.role", "Input should be"),
    ({"input": []}, "input", "no messages"),
    ({"max_output_tokens": 0}, "max_output_tokens", "max_output_tokens=0"),
    ({"temperature": -1}, "temperature", "temperature"),
    ({"frequency_penalty": 1}, "frequency_penalty", "does not know the field"),
]


@pytest.mark.parametrize("fields, param, says", REFUSED, ids=[f"{p}:{i}" for i, (_, p, _) in enumerate(REFUSED)])
def test_what_is_not_implemented_is_refused_by_name(client, model_name, fields, param, says):
    extra = {k: v for k, v in fields.items() if k in ("frequency_penalty",)}
    kw = {"input": "hi", "max_output_tokens": 4, **{k: v for k, v in fields.items() if k not in extra}}
    body = _refused(lambda: client.responses.create(model=model_name, extra_body=extra or None, **kw))
    assert body["param"] == param and says in body["message"], body
    assert body["type"] == "invalid_request_error"


def test_bookkeeping_fields_are_accepted(client, model_name):
    r = _create(client, model_name, input="hi", max_output_tokens=2, store=True, metadata={"k": "v"}, user="u",
                truncation="disabled", reasoning={"effort": "none"}, parallel_tool_calls=False, service_tier="auto")
    assert r.metadata == {"k": "v"} and r.store is True and r.parallel_tool_calls is False


def test_an_unknown_id_is_404(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.retrieve("resp_123")
    assert e.value.body["param"] == "response_id" and "is kept" in e.value.body["message"]


def test_an_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model="nope", input="hi")
    assert e.value.body["param"] == "model"


def test_a_client_that_leaves_a_stream_cancels_the_request(cluster, client, model_name):
    stream = _create(client, model_name, input="hello there", max_output_tokens=1500, stream=True)
    for event in stream:
        if event.type == "response.output_text.delta":
            break
    running = cluster.stub.GetServerStatus(pb.GetServerStatusRequest(), timeout=10, metadata=AUTH).num_running
    stream.close()
    assert running == 1
    wait_until_idle(cluster, "the request ran on after its client left")
