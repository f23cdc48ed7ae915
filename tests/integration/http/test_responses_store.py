"""Kept responses on both real services, through the `openai` package: previous_response_id
continues a kept conversation (greedy: exactly the tokens of the chat completion of all its
messages), across function calls, after a stream, after the responses before it were deleted;
store false keeps nothing; GET and DELETE; and, on a cluster of its own with tiny bounds, the
least recently used response dropped first by count and by bytes, and a rebuilt conversation
refused by --max-chat-messages and --max-prompt-bytes."""

import json

import pytest

openai = pytest.importorskip("openai")

from benchmarks.cluster import Cluster  # noqa: E402
from tests.integration.conftest import CPU_EXECUTOR  # noqa: E402
from tests.integration.http.conftest import API_KEY  # noqa: E402
from tests.integration.http.test_responses_api import CHAT_WEATHER, CUT, FORCED, NAMED, WEATHER  # noqa: E402

MAX_ENTRIES, MAX_BYTES = 3, 30_000  # the small cluster's: two big responses fit, three do not
BIG = {f"{i:02d}" + "k" * 62: "v" * 512 for i in range(16)}  # metadata at OpenAI's bounds: ~13 KB kept
MAX_MESSAGES, MAX_PROMPT_BYTES = 6, 600


def _create(client, model_name, **kw):
    return client.responses.create(model=model_name, **{"temperature": 0, "max_output_tokens": CUT, **kw})


def _chat(client, model_name, messages, **kw):
    return client.chat.completions.create(model=model_name, messages=messages, temperature=0,
                                          max_tokens=CUT, **kw)


def _same(response, chat) -> None:
    assert response.output_text == chat.choices[0].message.content
    assert (response.usage.input_tokens, response.usage.output_tokens) == (
        chat.usage.prompt_tokens, chat.usage.completion_tokens)


def _not_found(call) -> dict:
    with pytest.raises(openai.BadRequestError) as e:
        call()
    assert (e.value.status_code, e.value.body["code"], e.value.body["param"]) == (
        400, "previous_response_not_found", "previous_response_id")
    return e.value.body


# ---------------------------------------------------------------- the package's cluster (defaults)


def test_two_turns_are_the_chat_of_both(client, model_name):
    first = _create(client, model_name, instructions="Answer in French.", input="hello there")
    second = _create(client, model_name, input="and then?", previous_response_id=first.id)
    assert first.store is True and second.previous_response_id == first.id
    # the first turn's instructions are not carried over (as OpenAI's are not)
    _same(second, _chat(client, model_name, [{"role": "user", "content": "hello there"},
                                             {"role": "assistant", "content": first.output_text},
                                             {"role": "user", "content": "and then?"}]))


def test_a_chain_of_three(client, model_name):
    messages, previous = [], None
    for text in ("one", "two", "three"):
        r = _create(client, model_name, input=[{"role": "user", "content": text}], previous_response_id=previous)
        messages.append({"role": "user", "content": text})
        _same(r, _chat(client, model_name, messages))
        messages.append({"role": "assistant", "content": r.output_text})
        previous = r.id


def test_a_function_call_and_its_output_across_turns(client, model_name):
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    first = _create(client, model_name, input=ask, tools=[WEATHER], tool_choice=NAMED, extra_body={"seed": 3}, **FORCED)
    (call,) = first.output
    assert call.type == "function_call" and json.loads(call.arguments)["city"] in ("Paris", "Rome", "Oslo")
    result = json.dumps({"forecast": "sunny"})
    r = _create(client, model_name, tools=[WEATHER], tool_choice="none", previous_response_id=first.id,
                input=[{"type": "function_call_output", "call_id": call.call_id, "output": result}])
    _same(r, _chat(client, model_name, ask + [
        {"role": "assistant", "tool_calls": [{"id": call.call_id, "type": "function",
                                              "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": result}], tools=[CHAT_WEATHER], tool_choice="none"))


def test_an_output_for_an_unknown_call_is_still_refused(client, model_name):
    first = _create(client, model_name, input="hi")
    with pytest.raises(openai.BadRequestError) as e:
        _create(client, model_name, previous_response_id=first.id,
                input=[{"type": "function_call_output", "call_id": "call_x", "output": "1"}])
    assert e.value.body["param"] == "input.0.call_id"


def test_store_false_keeps_nothing(client, model_name):
    r = _create(client, model_name, input="hi", store=False)
    assert r.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    body = _not_found(lambda: _create(client, model_name, input="x", previous_response_id=r.id))
    assert body["message"].startswith(f"Previous response with id '{r.id}' not found")


def test_get_and_delete(client, model_name):
    a = _create(client, model_name, input="hello there", metadata={"k": "v"})
    assert client.responses.retrieve(a.id).model_dump() == a.model_dump()
    b = _create(client, model_name, input="and then?", previous_response_id=a.id)
    assert client.delete(f"/responses/{a.id}", cast_to=object) == {"id": a.id, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(a.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(a.id)
    _not_found(lambda: _create(client, model_name, input="x", previous_response_id=a.id))
    # b kept its whole conversation: it continues after a is gone
    c = _create(client, model_name, input="why?", previous_response_id=b.id)
    _same(c, _chat(client, model_name, [
        {"role": "user", "content": "hello there"}, {"role": "assistant", "content": a.output_text},
        {"role": "user", "content": "and then?"}, {"role": "assistant", "content": b.output_text},
        {"role": "user", "content": "why?"}]))
    assert [i.content[0].text for i in client.responses.input_items.list(c.id)] == ["why?"]


def test_a_stream_is_kept_once_finished(client, model_name):
    events = list(_create(client, model_name, input="hello there", stream=True))
    final = events[-1].response
    assert events[-1].type == "response.incomplete" and final.store is True
    assert client.responses.retrieve(final.id).model_dump() == final.model_dump()
    r = _create(client, model_name, input="and then?", previous_response_id=final.id)
    _same(r, _chat(client, model_name, [{"role": "user", "content": "hello there"},
                                        {"role": "assistant", "content": final.output_text},
                                        {"role": "user", "content": "and then?"}]))


# ---------------------------------------------------------------- a cluster with tiny bounds


@pytest.fixture(scope="module")
def small(model_folder, tmp_path_factory):
    c = Cluster(model_folder, tmp_path_factory.mktemp("logs-responses-store"), CPU_EXECUTOR,
                ["--api-key", API_KEY, "--responses-store-max-entries", str(MAX_ENTRIES),
                 "--responses-store-max-bytes", str(MAX_BYTES), "--max-chat-messages", str(MAX_MESSAGES),
                 "--max-prompt-bytes", str(MAX_PROMPT_BYTES)], http=True)
    with openai.OpenAI(base_url=c.http_url + "/v1", api_key=API_KEY, max_retries=0, timeout=60) as client:
        yield client, client.models.list().data[0].id
    c.stop()


def _kept(client, response_id: str) -> bool:
    """Whether it is kept (a retrieve: it becomes the most recently used)."""
    try:
        client.responses.retrieve(response_id)
        return True
    except openai.NotFoundError:
        return False


def test_the_least_recently_used_goes_first_by_count(small):
    client, model_name = small
    a, b, c, d = (_create(client, model_name, input="hi", max_output_tokens=1).id for _ in range(4))
    assert [_kept(client, i) for i in (a, b, c, d)] == [False, True, True, True]  # now b, c, d
    _not_found(lambda: _create(client, model_name, input="x", previous_response_id=a))
    _kept(client, b)  # c, d, b
    e = _create(client, model_name, input="hi", max_output_tokens=1, previous_response_id=d).id  # b, d, e
    assert [_kept(client, i) for i in (c, d, b, e)] == [False, True, True, True]


def test_the_least_recently_used_goes_first_by_bytes(small):
    client, model_name = small
    x, y = (_create(client, model_name, input="hi", max_output_tokens=1, metadata=BIG).id for _ in range(2))
    assert _kept(client, x) and _kept(client, y)  # two fit (and x is now older than y)
    z = _create(client, model_name, input="hi", max_output_tokens=1, metadata=BIG).id
    assert [_kept(client, i) for i in (x, y, z)] == [False, True, True]  # three are within the count, not the bytes


def test_a_rebuilt_conversation_is_checked_as_one(small):
    client, model_name = small
    three = [{"role": "user", "content": t} for t in ("a", "b", "c")]
    first = _create(client, model_name, input=three, max_output_tokens=1)  # 3 items + 1 output
    with pytest.raises(openai.BadRequestError) as e:
        _create(client, model_name, input=three, previous_response_id=first.id)
    assert e.value.body["param"] == "input" and e.value.body["message"] == (
        f"the conversation of previous_response_id has 4 items and input 3: 7 in all; the limit is "
        f"{MAX_MESSAGES} (--max-chat-messages)")
    second = _create(client, model_name, input=three[:2], previous_response_id=first.id, max_output_tokens=1)
    with pytest.raises(openai.BadRequestError) as e:  # 7 items kept: the conversation alone is over
        _create(client, model_name, input="d", previous_response_id=second.id)
    assert e.value.body["param"] == "previous_response_id"
    long = _create(client, model_name, input="x" * 400, max_output_tokens=1)
    with pytest.raises(openai.BadRequestError) as e:
        _create(client, model_name, input="y" * 400, previous_response_id=long.id)
    assert e.value.body["param"] == "input" and f"the limit is {MAX_PROMPT_BYTES}" in e.value.body["message"]
    assert e.value.body["message"].endswith("(the input after the 2 items of the conversation of previous_response_id)")
