"""Tokenization off the event loop: a few worker threads encode, render chat templates, list
token texts and decode ids, so that one large prompt never delays another request's stream.

`tokenizers`' `Tokenizer.encode` holds the GIL for its whole run (a 10 MB prompt: 11-16 s in
which no other RPC of the API process made progress), while `encode_batch` releases it; the
workers therefore call `encode_batch([text])`, which gives the same encoding. Small prompts are
encoded on the loop: the hop to a thread costs more than they do (the same for decoding: the
workers call `decode_batch([ids])`, small id lists are decoded on the loop). After a large prompt the
workers hand the freed memory back to the system (glibc keeps it in per-thread arenas
otherwise: +1.1 GB retained after one 10 MB prompt).

A prompt is never tokenized much past the context: one of more than max_tokens x the
vocabulary's longest token (in bytes) is refused untokenized, and a long one is tokenized a
bounded prefix first (refused if the prefix alone is over), so a 4 MiB prompt costs at most about
a context's worth of tokens, not its 2.4 M (~600 MB of encodings).
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import jinja2

from scheduler_svc.api.memory import find_malloc_trim
from scheduler_svc.api.prompts import ChatPrompt, TextPrompt, utf8_len
from scheduler_svc.api.validation import invalid, prompt_over_context
from scheduler_svc.core.tokenizer import Tokenizer
from scheduler_svc.messages import RequestError

log = logging.getLogger("llmserve.api")

# Prompts up to this many characters are encoded on the loop (~0.3 ms at most); the thread
# hop alone costs ~0.1 ms of latency.
INLINE_MAX_CHARS = 1024
# Id lists up to this length are decoded on the loop, for the same reason.
INLINE_MAX_IDS = 256
# After a prompt of at least this many characters the worker calls malloc_trim(0).
TRIM_AFTER_CHARS = 1 << 20
# Texts longer than this many characters (and than 4 characters a token of the context) are
# tokenized a prefix first; the whole text has at least the prefix's count less PREFIX_SLACK
# tokens (what re-tokenizing the prefix's cut last word with the rest of it can merge).
MIN_PREFIX_CHARS = 1 << 16
PREFIX_SLACK = 64


@dataclass(frozen=True)
class Encoded:
    """A tokenized prompt. Past `max_tokens`, only the count is known: the ids were never
    listed (1.2 M Python ints for a 2 MB prompt), the prompt is refused on the count."""

    num_tokens: int
    token_ids: list[int] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)  # each token's text, when asked for


class TokenizePool:
    """A bounded pool of tokenizer threads: at most `max_pending` prompts queued or running;
    one more is refused with RESOURCE_EXHAUSTED."""

    def __init__(self, tokenizer: Tokenizer, num_workers: int, max_pending: int):
        self._tokenizer = tokenizer
        self._executor = ThreadPoolExecutor(max(1, num_workers), thread_name_prefix="llmserve-tokenize")
        self._max_pending = max_pending
        self._num_pending = 0
        self._release_memory = find_malloc_trim()

    @property
    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    async def encode(self, prompt: TextPrompt | ChatPrompt, max_tokens: int,
                     with_tokens: bool = False) -> Encoded:
        """Token ids (and texts) of a text or chat prompt; only the count when > max_tokens."""
        num_chars = _num_chars(prompt)
        if num_chars <= INLINE_MAX_CHARS:
            return self._encode(prompt, max_tokens, with_tokens)
        return await self._in_worker(self._encode_in_worker, prompt, max_tokens, with_tokens, num_chars)

    async def decode(self, token_ids: list[int], skip_special_tokens: bool) -> str:
        """The text of token ids (checked to be in the vocabulary by the caller)."""
        if len(token_ids) <= INLINE_MAX_IDS:
            return self._tokenizer.decode(token_ids, skip_special_tokens)
        return await self._in_worker(self._decode_in_worker, token_ids, skip_special_tokens)

    async def _in_worker(self, fn, *args):
        """fn(*args) on a worker thread; RESOURCE_EXHAUSTED when max_pending jobs are queued."""
        if self._num_pending >= self._max_pending:
            raise RequestError("RESOURCE_EXHAUSTED",
                               f"{self._num_pending} prompts are already waiting to be tokenized; "
                               "retry later")
        self._num_pending += 1
        try:  # a cancelled call drops its queued job; a running one finishes unobserved
            result = await asyncio.get_running_loop().run_in_executor(self._executor, _caught, fn, *args)
        finally:
            self._num_pending -= 1
        if isinstance(result, _Refused):  # raised afresh: see _caught
            raise RequestError(result.code, result.message, result.param)
        return result

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _encode_in_worker(self, prompt, max_tokens: int, with_tokens: bool, num_chars: int) -> Encoded:
        try:
            return self._encode(prompt, max_tokens, with_tokens)
        finally:  # the encoding (and the rendered chat) died with _encode's frame
            if num_chars >= TRIM_AFTER_CHARS:
                self._release_memory()

    def _decode_in_worker(self, token_ids: list[int], skip_special_tokens: bool) -> str:
        return self._tokenizer.hf.decode_batch([token_ids], skip_special_tokens=skip_special_tokens)[0]

    def _encode(self, prompt: TextPrompt | ChatPrompt, max_tokens: int, with_tokens: bool) -> Encoded:
        if isinstance(prompt, ChatPrompt):
            text, add_special_tokens = self._render(prompt), False  # the template writes them
        else:
            text, add_special_tokens = prompt.text, prompt.add_special_tokens
        self._refuse_far_over(text, add_special_tokens, max_tokens)
        encoding = self._tokenizer.hf.encode_batch([text], add_special_tokens=add_special_tokens)[0]
        num_tokens = len(encoding)
        if num_tokens > max_tokens:
            return Encoded(num_tokens)
        return Encoded(num_tokens, encoding.ids, encoding.tokens if with_tokens else [])

    def _refuse_far_over(self, text: str, add_special_tokens: bool, max_tokens: int) -> None:
        """INVALID_ARGUMENT for a text certainly over max_tokens, without tokenizing it whole:
        over the byte bound (no tokenizing at all), else over in a prefix (prefixes grow until
        one is over or the prefix would be the whole text)."""
        per_token = self._tokenizer.max_token_bytes
        if per_token is not None and len(text) > max_tokens:  # (a short one: tokenized anyway)
            num_bytes = utf8_len(text)
            if num_bytes > max_tokens * per_token:
                raise prompt_over_context(-(-num_bytes // per_token), max_tokens, f"its {num_bytes} "
                                          f"bytes, at most {per_token} a token; not tokenized")
        target = max_tokens + PREFIX_SLACK
        size = max(MIN_PREFIX_CHARS, 4 * target)
        while size < len(text):
            prefix = self._tokenizer.hf.encode_batch([text[:size]], add_special_tokens=add_special_tokens)
            n = len(prefix[0])
            if n > target:
                raise prompt_over_context(n - PREFIX_SLACK, max_tokens, f"counted in its first "
                                          f"{size} characters; the rest not tokenized")
            size = int(size * min(4.0, max(1.25, 1.25 * target / max(n, 1))))

    def _render(self, prompt: ChatPrompt) -> str:
        if self._tokenizer.chat_template is None:
            raise invalid("this model has no chat template: send text or token ids")
        try:
            return prompt.render(self._tokenizer)
        except jinja2.TemplateError as e:  # the template's own words (raise_exception) are for users
            raise invalid(f"the chat template could not render these messages: {e}") from e
        except Exception as e:  # anything else is still this input's problem, but its text is ours
            log.info("chat template failed on a request: %r", e)
            raise invalid("the chat template could not render these messages") from e


class _Refused(RequestError):
    """A refusal made in a worker, returned rather than raised through the future."""


def _caught(fn, *args):
    """fn(*args), or its refusal without its traceback: raised through the executor's future,
    the error's traceback (the worker's frames, holding the prompt) and the future holding the
    error made a cycle that kept each refused 4 MiB prompt (~17 MB of objects) until the
    cyclic collector ran."""
    try:
        return fn(*args)
    except RequestError as e:
        return _Refused(e.code, e.message, e.param)


def _num_chars(prompt: TextPrompt | ChatPrompt) -> int:
    if isinstance(prompt, TextPrompt):
        return len(prompt.text)
    return sum(len(m.role) + len(m.content) for m in prompt.messages)
