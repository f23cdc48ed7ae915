"""A prompt far over the context is refused without being tokenized whole: over the byte bound
(the vocabulary's longest token) untokenized, else on a bounded prefix; one within is tokenized
exactly as before. max_token_bytes is a true bound, or None where none holds."""

import asyncio
import json

import pytest

from scheduler_svc.api.prompts import ChatPrompt, TextPrompt
from scheduler_svc.api.tokenize_pool import MIN_PREFIX_CHARS, TokenizePool
from scheduler_svc.core.tokenizer import max_token_bytes
from scheduler_svc.messages import RequestError


class Turn:
    def __init__(self, role, content):
        self.role, self.content = role, content


class Counting:
    """The tokenizer's hf object, counting the characters it was asked to encode."""

    def __init__(self, hf):
        self._hf, self.chars = hf, []

    def encode_batch(self, texts, add_special_tokens=True):
        self.chars += [len(t) for t in texts]
        return self._hf.encode_batch(texts, add_special_tokens=add_special_tokens)

    def __getattr__(self, name):
        return getattr(self._hf, name)


def _refusal(tok, prompt, max_tokens: int) -> tuple[RequestError, list[int]]:
    counting = tok.hf = Counting(tok.hf)

    async def run():
        pool = TokenizePool(tok, num_workers=1, max_pending=4)
        try:
            with pytest.raises(RequestError) as err:
                await pool.encode(prompt, max_tokens)
        finally:
            pool.close()
        return err.value

    try:
        return asyncio.run(run()), counting.chars
    finally:
        tok.hf = counting._hf


def test_the_longest_token_bounds_every_encoding(tok):
    bound = tok.max_token_bytes
    assert bound == max(len(t.encode()) for t in tok.hf.get_vocab(True))
    for text in ["a" * 5000, " " * 5000, "日本語 🚀 " * 500, "The quick brown fox " * 300]:
        assert len(tok.encode(text, add_special_tokens=False)) >= len(text.encode()) / bound


def test_no_bound_where_the_normalizer_or_pre_tokenizer_drops_text(tok):
    spec = json.loads(tok.hf.to_str())
    assert max_token_bytes(tok.hf, spec) == tok.max_token_bytes
    for key, step in [("normalizer", {"type": "NFKC"}), ("normalizer", {"type": "Strip"}),
                      ("pre_tokenizer", {"type": "Whitespace"}),
                      ("normalizer", {"type": "Sequence", "normalizers": [{"type": "Lowercase"}]})]:
        assert max_token_bytes(tok.hf, {**spec, key: step}) is None, step
    assert max_token_bytes(tok.hf, {**spec, "normalizer": {"type": "NFC"}}) == 3 * tok.max_token_bytes
    assert max_token_bytes(tok.hf, {**spec, "model": {"type": "Unigram"}}) is None


def test_over_the_byte_bound_is_refused_untokenized(tok):
    text = "The quick brown fox jumps " * 160_000  # 4 MiB
    err, encoded = _refusal(tok, TextPrompt(text), 2047)
    assert err.code == "INVALID_ARGUMENT" and encoded == []
    assert "prompt" in err.message and "context" in err.message and "--max-model-len" in err.message
    assert f"at least {-(-len(text) // tok.max_token_bytes)} tokens" in err.message
    chat = ChatPrompt([Turn("user", text[:len(text) // 2]), Turn("user", text[:len(text) // 2])])
    err, encoded = _refusal(tok, chat, 2047)
    assert err.code == "INVALID_ARGUMENT" and encoded == []  # the rendered chat's bytes


def test_without_a_byte_bound_a_bounded_prefix_is_tokenized(tok):
    text = "The quick brown fox jumps " * 160_000
    tok.max_token_bytes, bound = None, tok.max_token_bytes
    try:
        err, encoded = _refusal(tok, TextPrompt(text), 2047)
    finally:
        tok.max_token_bytes = bound
    assert err.code == "INVALID_ARGUMENT" and "the rest not tokenized" in err.message
    assert encoded == [MIN_PREFIX_CHARS] and int(err.message.split()[5]) > 2047


def test_a_long_prompt_within_the_context_is_tokenized_exactly(tok):
    text = "The quick brown fox jumps " * 20_000  # 520 KB, more than one prefix
    want = tok.encode(text)

    async def run():
        pool = TokenizePool(tok, num_workers=1, max_pending=4)
        try:
            return await pool.encode(TextPrompt(text), len(want)), await pool.encode(TextPrompt(text), len(want) - 1)
        finally:
            pool.close()

    within, over = asyncio.run(run())
    assert within.token_ids == want
    assert (over.num_tokens, over.token_ids) == (len(want), [])  # just over: the exact count
