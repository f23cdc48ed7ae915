"""Checks a request before it is admitted (no grpc here): its sizes before any tokenization
(SizeLimits, the --max-* flags), then the prompt against the model's limits. The sampling
parameters are checked by request_params.py."""

from __future__ import annotations

from dataclasses import dataclass

from llmserve.limits import MAX_LOGIT_BIAS, MAX_LOGPROBS, MAX_MIN_TOKENS_STOP_IDS
from llmserve.structured.constraint import LIMITS as CONSTRAINT_LIMITS
from scheduler_svc.api.prompts import Prompt, TextPrompt, TokenIdsPrompt, utf8_len
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.messages import RequestError


def invalid(message: str, param: str | None = None) -> RequestError:
    return RequestError("INVALID_ARGUMENT", message, param)


@dataclass(frozen=True)
class Limits:
    """What the served model, the executor and the KV pool allow."""

    max_model_len: int
    vocab_size: int
    block_size: int
    num_usable_blocks: int
    eos_token_ids: tuple[int, ...] = ()
    max_logprobs: int = MAX_LOGPROBS  # the executor's (ExecutorInfo.max_logprobs ...)
    max_logit_bias: int = MAX_LOGIT_BIAS
    max_min_tokens_stop_ids: int = MAX_MIN_TOKENS_STOP_IDS
    prefix_caching: bool = True  # samples of one request share their prompt's blocks


_FLAGS = SchedulerConfig()  # the flags' defaults: SizeLimits() is what a plain start allows


@dataclass(frozen=True)
class SizeLimits:
    """Caps on what one request may carry, checked before any tokenization (flags of the same
    names, SchedulerConfig); the prompt's token count is capped by the model's context."""

    max_prompt_bytes: int = _FLAGS.max_prompt_bytes
    max_chat_messages: int = _FLAGS.max_chat_messages
    max_stop_strings: int = _FLAGS.max_stop_strings
    max_stop_bytes: int = _FLAGS.max_stop_bytes
    max_stop_token_ids: int = _FLAGS.max_stop_token_ids
    max_n: int = _FLAGS.max_n

    @classmethod
    def from_config(cls, config) -> SizeLimits:
        return cls(**{name: getattr(config, name) for name in cls.__dataclass_fields__})


_EMPTY = "the prompt is empty: send non-empty text, token ids or chat messages"
# request_id is echoed in every streamed message: a long one would multiply the response size.
MAX_REQUEST_ID_BYTES = 256
# Wire bytes a request may need beyond its prompt and stop strings (field tags, lengths, the
# sampling scalars, request_id, per-message framing of chat turns).
_WIRE_OVERHEAD_BYTES = 64 << 10
_MAX_VARINT_BYTES = 10  # a negative int32 is sign-extended to 10 bytes on the wire
# A logit_bias map entry: its tag and length, the key's tag and varint, the float's tag and bytes.
_MAX_BIAS_ENTRY_BYTES = 2 + 1 + _MAX_VARINT_BYTES + 1 + 4


def max_request_bytes(sizes: SizeLimits, max_model_len: int, max_logit_bias: int = MAX_LOGIT_BIAS) -> int:
    """The public server's gRPC max receive message length: the largest request the limits
    allow, so that anything larger is refused by gRPC itself (RESOURCE_EXHAUSTED) unread."""
    prompt = max(sizes.max_prompt_bytes + 8 * sizes.max_chat_messages,
                 _MAX_VARINT_BYTES * max_model_len)
    stops = sizes.max_stop_bytes + 8 * sizes.max_stop_strings
    bias = _MAX_BIAS_ENTRY_BYTES * max_logit_bias
    # a structured-output constraint: its text (a choice's strings each framed)
    constraint = CONSTRAINT_LIMITS.max_bytes + 8 * CONSTRAINT_LIMITS.max_choices
    return (prompt + stops + _MAX_VARINT_BYTES * sizes.max_stop_token_ids + bias + constraint
            + _WIRE_OVERHEAD_BYTES)


def _over(what: str, num: int, unit: str, limit: int, flag: str, param: str = "prompt") -> RequestError:
    return invalid(f"{what} has {num} {unit}; the limit is {limit} ({flag})", param)


def check_prompt_size(prompt: Prompt | None, sizes: SizeLimits, limits: Limits) -> None:
    """Empty and oversized prompts, refused before tokenizing. A chat whose messages are all
    empty is accepted: the template's role headers make a real prompt."""
    if prompt is None:
        raise invalid("no input: set one of text, token_ids or chat", "prompt")
    if isinstance(prompt, TokenIdsPrompt):
        if len(prompt.ids) == 0:
            raise invalid(_EMPTY, "prompt")
        if len(prompt.ids) >= limits.max_model_len:  # before looking at any id
            raise _context_error(len(prompt.ids), limits)
        return
    if isinstance(prompt, TextPrompt):
        if prompt.text == "":
            raise invalid(_EMPTY, "prompt")
        num_bytes = utf8_len(prompt.text)
        if num_bytes > sizes.max_prompt_bytes:
            raise _over("the prompt text", num_bytes, "bytes", sizes.max_prompt_bytes,
                        "--max-prompt-bytes")
        return
    if not prompt.messages:
        raise invalid("chat has no messages", "prompt")
    if len(prompt.messages) > sizes.max_chat_messages:
        raise _over("the chat", len(prompt.messages), "messages", sizes.max_chat_messages,
                    "--max-chat-messages")
    num_bytes = sum(utf8_len(m.role) + utf8_len(m.content) for m in prompt.messages)
    if num_bytes > sizes.max_prompt_bytes:
        raise _over("the chat", num_bytes, "bytes of roles and contents", sizes.max_prompt_bytes,
                    "--max-prompt-bytes")


def check_request_size(raw, request_id: str, sizes: SizeLimits) -> None:
    """Stop conditions, n and the request id (of request_params.RawParams), refused before
    tokenizing."""
    if raw.n is not None and not 1 <= raw.n <= sizes.max_n:
        raise invalid(f"n={raw.n}: ask for 1 to {sizes.max_n} parallel samples (--max-n)", "n")
    if len(raw.stop) > sizes.max_stop_strings:
        raise _over("stop", len(raw.stop), "strings", sizes.max_stop_strings, "--max-stop-strings", "stop")
    num_stop_bytes = sum(utf8_len(s) for s in raw.stop)
    if num_stop_bytes > sizes.max_stop_bytes:
        raise _over("stop", num_stop_bytes, "bytes", sizes.max_stop_bytes, "--max-stop-bytes", "stop")
    if len(raw.stop_token_ids) > sizes.max_stop_token_ids:
        raise _over("stop_token_ids", len(raw.stop_token_ids), "ids", sizes.max_stop_token_ids,
                    "--max-stop-token-ids", "stop_token_ids")
    if utf8_len(request_id) > MAX_REQUEST_ID_BYTES:
        raise invalid(f"request_id has {utf8_len(request_id)} bytes; at most {MAX_REQUEST_ID_BYTES}",
                      "request_id")


def _context_error(num_tokens: int, limits: Limits) -> RequestError:
    return invalid(
        f"the prompt has {num_tokens} tokens but the model's context is {limits.max_model_len} "
        f"tokens (the executor's --max-model-len); send at most {limits.max_model_len - 1}", "prompt"
    )


def check_prompt_len(num_tokens: int, limits: Limits) -> None:
    """The token count, as soon as tokenization knows it (before the ids are even listed)."""
    if num_tokens >= limits.max_model_len:
        raise _context_error(num_tokens, limits)


def prompt_over_context(at_least: int, max_tokens: int, counted: str) -> RequestError:
    """A prompt refused before it was tokenized whole: it has at least `at_least` tokens (by
    `counted`), more than the `max_tokens` the context takes (the model's context less one
    for generation, or the whole context for Tokenize)."""
    return invalid(f"the prompt has at least {at_least} tokens ({counted}) but the model's "
                   f"context takes at most {max_tokens} (the executor's --max-model-len)", "prompt")


def check_prompt(token_ids, limits: Limits) -> None:
    """The tokenized prompt: non-empty, within the context, every id in the vocabulary."""
    if len(token_ids) == 0:
        raise invalid(_EMPTY, "prompt")
    check_prompt_len(len(token_ids), limits)
    bad = [t for t in token_ids if not 0 <= t < limits.vocab_size]
    if bad:
        raise invalid(
            f"prompt has token ids outside the vocabulary [0, {limits.vocab_size}): {bad[:5]}", "prompt"
        )


def check_detokenize_ids(token_ids, limits: Limits) -> list[int]:
    """Detokenize's ids (the wire's repeated field): at most the model's context, each in the
    vocabulary; returned as a list."""
    if len(token_ids) > limits.max_model_len:
        raise invalid(f"Detokenize got {len(token_ids)} token ids; it answers up to the model's "
                      f"context of {limits.max_model_len}", "token_ids")
    bad = [t for t in token_ids if not 0 <= t < limits.vocab_size]
    if bad:
        raise invalid(f"token ids outside the vocabulary [0, {limits.vocab_size}): {bad[:5]}",
                      "token_ids")
    return list(token_ids)
