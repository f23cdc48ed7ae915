"""POST /v1/responses in process, with the official `openai` client, on a scripted engine (the
model's text is given, in chosen pieces): the output items of an empty answer and of pieces,
an engine error after the stream began (response.failed), and the prompt the items became."""

import pytest

openai = pytest.importorskip("openai")

from scheduler_svc.api.tools.plan import ToolSettings  # noqa: E402
from scheduler_svc.core.request import FinishReason  # noqa: E402
from scheduler_svc.messages import RequestError  # noqa: E402
from tests.scheduler.api.tools.scripted import serving  # noqa: E402


@pytest.fixture
def served(tok):
    with serving(tok, ToolSettings()) as (client, engine):
        yield client, engine


def test_pieces_are_one_message_and_the_stream_adds_up(served):
    client, engine = served
    engine.script, engine.finish = [["Hel", "lo", " there"]], FinishReason.STOP
    r = client.responses.create(model="tiny", input="hi")
    assert r.status == "completed" and r.output_text == "Hello there" and len(r.output) == 1
    assert r.usage.output_tokens == 3 and r.usage.input_tokens == len(engine.prompts[-1])
    events = list(client.responses.create(model="tiny", input="hi", stream=True))
    assert [e.delta for e in events if e.type == "response.output_text.delta"] == ["Hel", "lo", " there"]
    assert events[-1].type == "response.completed" and events[-1].response.output_text == "Hello there"


def test_an_empty_answer_is_one_empty_message(served):
    client, engine = served
    engine.script, engine.finish = [[""]], FinishReason.EOS
    r = client.responses.create(model="tiny", input="hi")
    assert r.status == "completed" and r.output_text == "" and [o.type for o in r.output] == ["message"]
    types = [e.type for e in client.responses.create(model="tiny", input="hi", stream=True)]
    assert types == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", "response.output_text.done", "response.content_part.done",
                     "response.output_item.done", "response.completed"]


def test_the_items_become_the_chat_prompt(served, tok):
    client, engine = served
    client.responses.create(model="tiny", instructions="Be terse.", input=[
        {"role": "developer", "content": "Use French."},
        {"role": "user", "content": [{"type": "input_text", "text": "Weather"}, {"type": "input_text", "text": "?"}]}])
    assert tok.decode(engine.prompts[-1], skip_special_tokens=False).endswith(
        "<|system|>\nBe terse.<|end|>\n<|system|>\nUse French.<|end|>\n<|user|>\nWeather?<|end|>\n<|assistant|>\n")


def test_an_engine_error_after_the_stream_began_is_response_failed(served):
    client, engine = served
    scripted = engine.generate

    async def failing(prompt_ids, params):
        async for out in scripted(prompt_ids, params):
            yield out
            raise RequestError("UNAVAILABLE", "the engine core process is gone")

    engine.script, engine.generate = [["a", "b"]], failing
    events = list(client.responses.create(model="tiny", input="hi", stream=True))
    assert [e.type for e in events][-2:] == ["response.output_text.delta", "response.failed"]
    failed = events[-1].response
    assert failed.status == "failed" and failed.error.code == "server_error"
    assert "engine core process is gone" in failed.error.message and failed.output_text == "a"
    with pytest.raises(openai.InternalServerError):  # collected: the error's own status
        client.responses.create(model="tiny", input="hi")
