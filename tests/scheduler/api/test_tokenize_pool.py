"""The tokenizer pool: the same ids as Tokenizer.encode, refusals on the count, the bound, and
the event loop kept free while a large prompt is encoded."""

import asyncio
import random
import time

import pytest

from scheduler_svc.api.prompts import ChatPrompt, TextPrompt
from scheduler_svc.api.memory import find_malloc_trim
from scheduler_svc.api.tokenize_pool import INLINE_MAX_CHARS, TokenizePool
from scheduler_svc.core.tokenizer import Tokenizer
from scheduler_svc.messages import RequestError


class Turn:
    def __init__(self, role, content):
        self.role, self.content = role, content


def _large_text(num_words: int) -> str:
    rng = random.Random(0)
    words = "The quick brown fox jumps over the lazy dog café 日本語 emoji 🚀 serving".split()
    return " ".join(rng.choice(words) for _ in range(num_words))


def test_same_ids_and_tokens_as_the_tokenizer_inline_and_in_a_worker(tok):
    async def run():
        pool = TokenizePool(tok, num_workers=1, max_pending=4)
        try:
            for text in ["Hello, world!", "Unicode: café 🚀", "x " * INLINE_MAX_CHARS]:
                for add in (True, False):
                    got = await pool.encode(TextPrompt(text, add), 10**6, with_tokens=True)
                    want = tok.encode(text, add_special_tokens=add)
                    assert got.token_ids == want and got.num_tokens == len(want)
                    assert got.tokens == [tok.id_to_token(i) for i in want]
            chat = [Turn("system", "Be brief. " * 200), Turn("user", "Hello 日本語")]
            got = await pool.encode(ChatPrompt(chat), 10**6)
            assert got.token_ids == tok.apply_chat_template(
                [{"role": t.role, "content": t.content} for t in chat])
        finally:
            pool.close()
    asyncio.run(run())


def test_past_the_cap_only_the_count_is_returned(tok):
    async def run():
        pool = TokenizePool(tok, num_workers=1, max_pending=4)
        try:
            text = "Hello world " * 500
            full = tok.encode(text)
            got = await pool.encode(TextPrompt(text), len(full) - 1)
            assert (got.num_tokens, got.token_ids) == (len(full), [])
            assert (await pool.encode(TextPrompt(text), len(full))).token_ids == full
        finally:
            pool.close()
    asyncio.run(run())


def test_a_large_prompt_leaves_the_loop_free_and_the_pool_is_bounded(tok):
    text = _large_text(150_000)  # ~0.9 MB: about half a second of encoding on one core

    async def run():
        pool = TokenizePool(tok, num_workers=1, max_pending=1)
        gaps = []

        async def tick():
            last = time.perf_counter()
            while True:
                await asyncio.sleep(0.005)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        ticker = asyncio.create_task(tick())
        try:
            start = time.perf_counter()
            big = asyncio.create_task(pool.encode(TextPrompt(text), 10**6))  # (within: all of it)
            await asyncio.sleep(0)
            with pytest.raises(RequestError) as err:  # the one pending slot is taken
                await pool.encode(TextPrompt(text), 10**6)
            assert err.value.code == "RESOURCE_EXHAUSTED"
            encoded = await big
            took = time.perf_counter() - start
        finally:
            ticker.cancel()
            pool.close()
        assert encoded.num_tokens == len(encoded.token_ids) > 2047
        assert took > 0.2  # long enough that a blocked loop would show
        assert max(gaps) < min(0.15, took / 2), (max(gaps), took)
    asyncio.run(run())


def _tokenizer_with_template(folder, template):
    import json

    from executor_svc.model_loader.random_model import build_tokenizer

    folder.mkdir()
    build_tokenizer(folder, vocab_size=512, max_model_len=2048)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return Tokenizer(folder)


def test_chat_template_errors_are_the_callers_without_internal_text(tmp_path):
    strict = _tokenizer_with_template(tmp_path / "strict", (
        "{% for m in messages %}{% if m['role'] not in ['user', 'assistant'] %}"
        "{{ raise_exception('roles must be user or assistant') }}{% endif %}"
        "{{ m['content'] }}{% endfor %}"))
    broken = _tokenizer_with_template(tmp_path / "broken", "{{ messages[0]['content'] + 1 }}")

    async def refusal(tok, chat):
        pool = TokenizePool(tok, num_workers=1, max_pending=4)
        try:
            with pytest.raises(RequestError) as err:
                await pool.encode(ChatPrompt(chat), 100)
        finally:
            pool.close()
        assert err.value.code == "INVALID_ARGUMENT" and "chat template" in err.value.message
        return err.value.message

    message = asyncio.run(refusal(strict, [Turn("robot", "hi")]))
    assert "roles must be user or assistant" in message  # the template's own words
    message = asyncio.run(refusal(broken, [Turn("user", "hi")]))
    assert "str" not in message and "TypeError" not in message  # Python's words stay in the log


def test_malloc_trim_is_found_on_glibc():
    import platform

    trim = find_malloc_trim()
    assert trim() in (None, 0, 1)
    if platform.libc_ver()[0] == "glibc":
        assert trim() in (0, 1)
