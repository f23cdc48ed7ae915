"""Tokenization off the event loop: a few worker threads encode, render chat templates, list
token texts and decode ids, so that one large prompt never delays another request's stream.

`tokenizers`' `Tokenizer.encode` holds the GIL for its whole run (a 10 MB prompt: 11-16 s in
which no other RPC of the API process made progress), while `encode_batch` releases it; the
workers therefore call `encode_batch([text])`, which gives the same encoding. Small prompts are
encoded on the loop: the hop to a thread costs more than they do (the same for decoding: the
workers call `decode_batch([ids])`, small id lists are decoded on the loop). After a large prompt the
workers hand the freed memory back to the system (glibc keeps it in per-thread arenas
otherwise: +1.1 GB retained after one 10 MB prompt).
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import jinja2

from scheduler_svc.api.prompts import ChatPrompt, TextPrompt
from scheduler_svc.api.validation import invalid
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
        self._release_memory = _find_malloc_trim()

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
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        finally:
            self._num_pending -= 1

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
        encoding = self._tokenizer.hf.encode_batch([text], add_special_tokens=add_special_tokens)[0]
        num_tokens = len(encoding)
        if num_tokens > max_tokens:
            return Encoded(num_tokens)
        return Encoded(num_tokens, encoding.ids, encoding.tokens if with_tokens else [])

    def _render(self, prompt: ChatPrompt) -> str:
        if self._tokenizer.chat_template is None:
            raise invalid("this model has no chat template: send text or token ids")
        try:
            return self._tokenizer.render_chat(prompt.as_dicts(), prompt.add_generation_prompt)
        except jinja2.TemplateError as e:  # the template's own words (raise_exception) are for users
            raise invalid(f"the chat template could not render these messages: {e}") from e
        except Exception as e:  # anything else is still this input's problem, but its text is ours
            log.info("chat template failed on a request: %r", e)
            raise invalid("the chat template could not render these messages") from e


def _num_chars(prompt: TextPrompt | ChatPrompt) -> int:
    if isinstance(prompt, TextPrompt):
        return len(prompt.text)
    return sum(len(m.role) + len(m.content) for m in prompt.messages)


def _find_malloc_trim() -> Callable[[], None]:
    """glibc's malloc_trim(0) (returns the free memory of every arena); a no-op elsewhere."""
    try:
        trim = ctypes.CDLL(None).malloc_trim  # ctypes releases the GIL around the call
    except (OSError, AttributeError):
        return lambda: None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)
