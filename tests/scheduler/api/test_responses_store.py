"""The kept responses (scheduler_svc/api/http/responses/store.py, stored.py): the store's bounds
(count and bytes, least recently used first, exact), and, in process with the `openai` client on
a scripted engine, the prompt a previous_response_id rebuilds, GET/DELETE/input_items, a
streamed response kept, and storing off."""

import gc
import sys
import tracemalloc

import pytest

openai = pytest.importorskip("openai")

from scheduler_svc.api.http.responses import stored  # noqa: E402
from scheduler_svc.api.http.responses.schemas import ResponsesRequest  # noqa: E402
from scheduler_svc.api.http.responses.store import (ENTRY_OVERHEAD, OBJECT_OVERHEAD, ResponseStore,  # noqa: E402
                                                    StoredResponse, counted_bytes)
from scheduler_svc.api.tools.plan import ToolSettings  # noqa: E402
from scheduler_svc.core.request import FinishReason  # noqa: E402
from tests.scheduler.api.tools.scripted import serving  # noqa: E402


def _entry(num_bytes: int) -> StoredResponse:
    return StoredResponse(b"{}", (), 0, num_bytes)


# ---------------------------------------------------------------- the store


def test_an_entry_is_counted_by_its_bytes_objects():
    turns = ((b"[1]", b"[]"), (b'["\xc3\xa9"]', b"[2,3]"))
    assert counted_bytes(b'{"id":1}', turns) == ENTRY_OVERHEAD + 8 + 3 + 2 + 6 + 5 + 5 * OBJECT_OVERHEAD
    assert sys.getsizeof(b"") + 8 <= OBJECT_OVERHEAD  # a bytes object's header and its tuple slot


def _response(i: int, text: str) -> dict:
    """A finished response's object as output.py answers it (the fields the store reads and more)."""
    return {"id": f"resp_{i}", "object": "response", "status": "completed", "metadata": {"k": "v" * 100},
            "output": [{"type": "message", "id": f"msg_{i}", "status": "completed", "role": "assistant",
                        "content": [{"type": "output_text", "text": text, "annotations": []}]},
                       {"type": "function_call", "id": f"fc_{i}", "status": "completed", "call_id": f"call_{i}",
                        "name": "get_weather", "arguments": '{"city": "Paris"}'}]}


def _traced_growth(build) -> int:
    """Bytes still allocated (tracemalloc) after build() than before it, the temporaries gone."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        build()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("chained", [False, True])
def test_the_bytes_counted_bound_the_memory_held(chained):
    """Kept responses, independent or each continuing the last, hold no more memory than they
    are counted for, and independent ones at least half of it (the count is not a loose guess)."""
    store = ResponseStore(max_entries=10_000, max_bytes=1 << 40)
    inputs = [[{"role": "user", "content": f"question {i} " + "é" * (i % 7) * 30},
               {"role": "user", "content": [{"type": "input_text", "text": "x" * (i % 13) * 20}]},
               {"type": "function_call_output", "call_id": f"call_{i}", "output": "sunny " * 10}]
              for i in range(400)]
    bodies = [ResponsesRequest.model_validate({"model": "m", "input": items}) for items in inputs]

    def build():
        before = None
        for i, body in enumerate(bodies):
            stored.keeper(store, body, before if chained else None)(_response(i, f"answer {i} " * 20))
            before = store.get(f"resp_{i}")

    held = _traced_growth(build)
    assert len(store) == len(bodies) and held <= store.num_bytes, (held, store.num_bytes)
    if not chained:
        assert held >= store.num_bytes // 2, (held, store.num_bytes)
    last = store.get(f"resp_{len(bodies) - 1}")
    conversation = stored.conversation(last)  # what a continuation rebuilds: the kept items, exactly
    assert len(conversation) == last.num_items == (len(bodies) if chained else 1) * 5
    assert conversation[-5].content == inputs[-1][0]["content"] and conversation[-1].arguments == '{"city": "Paris"}'
    assert [i.model_dump(exclude_none=True)["output"] for i in stored.input_items(last)[2:]] == ["sunny " * 10]


def test_the_least_recently_used_goes_first_by_count():
    store = ResponseStore(max_entries=2, max_bytes=1000)
    store.put("a", _entry(10))
    store.put("b", _entry(10))
    store.put("c", _entry(10))
    assert "a" not in store and "b" in store and "c" in store and store.num_bytes == 20
    store.get("b")  # used: now c is the oldest
    store.put("d", _entry(10))
    assert ("b" in store, "c" in store, "d" in store) == (True, False, True)


def test_the_least_recently_used_goes_first_by_bytes():
    store = ResponseStore(max_entries=100, max_bytes=100)
    for name in "abc":
        store.put(name, _entry(40))
    assert ("a" in store, "b" in store, "c" in store, store.num_bytes) == (False, True, True, 80)
    store.put("d", _entry(60))  # b goes: c and d are exactly the bound
    assert ("b" in store, "c" in store, "d" in store, store.num_bytes) == (False, True, True, 100)
    store.put("e", _entry(1))  # c, the oldest, goes
    assert ("c" in store, "d" in store, "e" in store, store.num_bytes) == (False, True, True, 61)
    store.put("f", _entry(100))  # both go
    assert len(store) == 1 and "f" in store and store.num_bytes == 100


def test_an_entry_over_the_byte_bound_is_not_kept_and_drops_nothing():
    store = ResponseStore(max_entries=4, max_bytes=100)
    store.put("a", _entry(50))
    assert not store.put("big", _entry(101))
    assert "big" not in store and "a" in store and store.num_bytes == 50
    assert store.delete("a") and not store.delete("a") and store.num_bytes == 0


def test_zero_is_off_and_negative_is_refused():
    assert not ResponseStore(0, 100).enabled and not ResponseStore(0, 100).put("a", _entry(1))
    assert not ResponseStore(10, 0).enabled
    with pytest.raises(ValueError):
        ResponseStore(-1, 100)


# ---------------------------------------------------------------- in process


@pytest.fixture
def served(tok):
    with serving(tok, ToolSettings(), responses_store_max_entries=8, responses_store_max_bytes=1 << 20) as s:
        s[1].finish = FinishReason.STOP
        yield s


def test_a_second_turn_is_the_chat_of_both(served, tok):
    client, engine = served
    engine.script = [["Hel", "lo"]]
    first = client.responses.create(model="tiny", instructions="Be terse.", input="hi")
    assert first.store is True and first.previous_response_id is None
    engine.script = [["Fine"]]
    second = client.responses.create(model="tiny", input="how are you?", previous_response_id=first.id)
    assert second.previous_response_id == first.id and second.output_text == "Fine"
    client.chat.completions.create(model="tiny", messages=[  # the first turn's instructions are not carried
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "how are you?"}])
    assert engine.prompts[-2] == engine.prompts[-1]
    assert tok.decode(engine.prompts[-1], skip_special_tokens=False).endswith(
        "<|user|>\nhi<|end|>\n<|assistant|>\nHello<|end|>\n<|user|>\nhow are you?<|end|>\n<|assistant|>\n")
    third = client.responses.create(model="tiny", instructions="Be kind.", input="bye", previous_response_id=second.id)
    assert tok.decode(engine.prompts[-1], skip_special_tokens=False) == (
        "<|bos|><|system|>\nBe kind.<|end|>\n<|user|>\nhi<|end|>\n<|assistant|>\nHello<|end|>\n<|user|>\n"
        "how are you?<|end|>\n<|assistant|>\nFine<|end|>\n<|user|>\nbye<|end|>\n<|assistant|>\n")
    assert third.status == "completed"


def test_get_delete_and_input_items(served):
    client, engine = served
    engine.script = [["ok"]]
    r = client.responses.create(model="tiny", input=[{"role": "user", "content": "a"},
                                                     {"role": "user", "content": [{"type": "input_text", "text": "b"}]},
                                                     {"role": "user", "content": "c", "id": "msg_mine"}])
    got = client.responses.retrieve(r.id)
    assert got.model_dump() == r.model_dump()
    page = client.responses.input_items.list(r.id, order="asc", limit=2)
    assert [i.content[0].text for i in page.data] == ["a", "b"] and page.has_more
    assert page.data[0].id.startswith("msg_") and page.data[0].status == "completed"
    one_by_one = client.responses.input_items.list(r.id, order="asc", limit=1)  # the SDK pages on `after`
    assert [i.content[0].text for i in one_by_one] == ["a", "b", "c"]
    desc = client.responses.input_items.list(r.id, limit=1)
    assert [i.id for i in desc.data] == ["msg_mine"] and desc.has_more
    assert [i.id for i in client.responses.input_items.list(r.id, after="msg_mine")][-1] == page.data[0].id
    for bad, param in (({"limit": 0}, "limit"), ({"limit": 101}, "limit"), ({"order": "up"}, "order"),
                       ({"after": "msg_nope"}, "after")):
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.input_items.list(r.id, **bad)
        assert e.value.body["param"] == param
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.cancel(r.id)
    assert "only background responses" in e.value.body["message"]
    deleted = client.delete(f"/responses/{r.id}", cast_to=object)
    assert deleted == {"id": r.id, "object": "response", "deleted": True}
    for call in (lambda: client.responses.retrieve(r.id), lambda: client.responses.delete(r.id),
                 lambda: client.responses.input_items.list(r.id), lambda: client.responses.cancel(r.id)):
        with pytest.raises(openai.NotFoundError) as e:
            call()
        assert e.value.body["code"] == "not_found" and e.value.body["param"] == "response_id"
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="tiny", input="x", previous_response_id=r.id)
    assert (e.value.body["code"], e.value.body["param"]) == ("previous_response_not_found", "previous_response_id")


def test_a_streamed_response_is_kept_once_finished(served):
    client, engine = served
    engine.script = [["a", "b"]]
    events = list(client.responses.create(model="tiny", input="hi", stream=True))
    assert events[0].response.store is True
    final = events[-1].response
    assert final.status == "completed" and client.responses.retrieve(final.id).model_dump() == final.model_dump()


def test_store_false_and_query_parameters(served):
    client, engine = served
    r = client.responses.create(model="tiny", input="hi", store=False)
    assert r.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="tiny", input="x", previous_response_id=r.id)
    assert "none created with store false" in e.value.body["message"]
    kept = client.responses.create(model="tiny", input="hi")
    for query, param in (({"stream": "true"}, "stream"), ({"foo": "1"}, "foo")):
        with pytest.raises(openai.BadRequestError) as e:
            client.get(f"/responses/{kept.id}", cast_to=object, options={"params": query})
        assert e.value.body["param"] == param


def test_metadata_bounds(served):
    client, _ = served
    for metadata, param in (({f"k{i}": "v" for i in range(17)}, "metadata"), ({"k" * 65: "v"}, "metadata"),
                            ({"k": "v" * 513}, "metadata.k")):
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model="tiny", input="hi", metadata=metadata)
        assert e.value.body["param"] == param


def test_nothing_is_kept_when_storing_is_off(tok):
    with serving(tok, ToolSettings()) as (client, engine):
        r = client.responses.create(model="tiny", input="hi")
        assert r.store is False
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model="tiny", input="x", previous_response_id=r.id)
        assert "keeps no responses" in e.value.body["message"]
        assert e.value.body["code"] == "previous_response_not_found"


def test_the_flags():
    from scheduler_svc.config import from_args
    config = from_args([])
    assert (config.responses_store_max_entries, config.responses_store_max_bytes) == (1024, 64 << 20)
    config = from_args(["--responses-store-max-entries", "0", "--responses-store-max-bytes", "4096"])
    assert (config.responses_store_max_entries, config.responses_store_max_bytes) == (0, 4096)
    with pytest.raises(SystemExit):
        from_args(["--responses-store-max-bytes", "-1"])
