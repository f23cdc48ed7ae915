"""Checks a request before it is admitted (no grpc here): its sizes before any tokenization
(SizeLimits, the --max-* flags), then the prompt and sampling parameters against the model's
limits."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from scheduler_svc.api.prompts import Prompt, TextPrompt, TokenIdsPrompt, utf8_len
from scheduler_svc.core.kv_cache_manager import max_blocks_needed
from scheduler_svc.core.request import SamplingParams
from scheduler_svc.messages import RequestError


def invalid(message: str) -> RequestError:
    return RequestError("INVALID_ARGUMENT", message)


@dataclass(frozen=True)
class Limits:
    """What the served model, the executor and the KV pool allow."""

    max_model_len: int
    vocab_size: int
    block_size: int
    num_usable_blocks: int
    eos_token_ids: tuple[int, ...] = ()
    max_logprobs: int = 20  # the executor's (ExecutorInfo.max_logprobs ...)
    max_logit_bias: int = 300
    max_min_tokens_stop_ids: int = 64
    prefix_caching: bool = True  # samples of one request share their prompt's blocks


@dataclass(frozen=True)
class RawParams:
    """Sampling fields as the client sent them; None = not set."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_k: int = 0
    top_p: float | None = None
    seed: int | None = None
    stop: Sequence[str] = ()  # may be the wire's repeated field: sizes are checked first
    stop_token_ids: Sequence[int] = ()
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    n: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    prompt_logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float | None = None
    min_p: float = 0.0
    logit_bias: Mapping[int, float] = field(default_factory=dict)  # may be the wire's map
    min_tokens: int = 0


@dataclass(frozen=True)
class SizeLimits:
    """Caps on what one request may carry, checked before any tokenization (flags of the same
    names, SchedulerConfig); the prompt's token count is capped by the model's context."""

    max_prompt_bytes: int = 4 << 20
    max_chat_messages: int = 1024
    max_stop_strings: int = 16
    max_stop_bytes: int = 4096
    max_stop_token_ids: int = 256
    max_n: int = 128

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


def max_request_bytes(sizes: SizeLimits, max_model_len: int, max_logit_bias: int = 300) -> int:
    """The public server's gRPC max receive message length: the largest request the limits
    allow, so that anything larger is refused by gRPC itself (RESOURCE_EXHAUSTED) unread."""
    prompt = max(sizes.max_prompt_bytes + 8 * sizes.max_chat_messages,
                 _MAX_VARINT_BYTES * max_model_len)
    stops = sizes.max_stop_bytes + 8 * sizes.max_stop_strings
    bias = _MAX_BIAS_ENTRY_BYTES * max_logit_bias
    return prompt + stops + _MAX_VARINT_BYTES * sizes.max_stop_token_ids + bias + _WIRE_OVERHEAD_BYTES


def _over(what: str, num: int, unit: str, limit: int, flag: str) -> RequestError:
    return invalid(f"{what} has {num} {unit}; the limit is {limit} ({flag})")


def check_prompt_size(prompt: Prompt | None, sizes: SizeLimits, limits: Limits) -> None:
    """Empty and oversized prompts, refused before tokenizing. A chat whose messages are all
    empty is accepted: the template's role headers make a real prompt."""
    if prompt is None:
        raise invalid("no input: set one of text, token_ids or chat")
    if isinstance(prompt, TokenIdsPrompt):
        if len(prompt.ids) == 0:
            raise invalid(_EMPTY)
        if len(prompt.ids) >= limits.max_model_len:  # before looking at any id
            raise _context_error(len(prompt.ids), limits)
        return
    if isinstance(prompt, TextPrompt):
        if prompt.text == "":
            raise invalid(_EMPTY)
        num_bytes = utf8_len(prompt.text)
        if num_bytes > sizes.max_prompt_bytes:
            raise _over("the prompt text", num_bytes, "bytes", sizes.max_prompt_bytes,
                        "--max-prompt-bytes")
        return
    if not prompt.messages:
        raise invalid("chat has no messages")
    if len(prompt.messages) > sizes.max_chat_messages:
        raise _over("the chat", len(prompt.messages), "messages", sizes.max_chat_messages,
                    "--max-chat-messages")
    num_bytes = sum(utf8_len(m.role) + utf8_len(m.content) for m in prompt.messages)
    if num_bytes > sizes.max_prompt_bytes:
        raise _over("the chat", num_bytes, "bytes of roles and contents", sizes.max_prompt_bytes,
                    "--max-prompt-bytes")


def check_request_size(raw: RawParams, request_id: str, sizes: SizeLimits) -> None:
    """Stop conditions, n and the request id, refused before tokenizing."""
    if raw.n is not None and not 1 <= raw.n <= sizes.max_n:
        raise invalid(f"n={raw.n}: ask for 1 to {sizes.max_n} parallel samples (--max-n)")
    if len(raw.stop) > sizes.max_stop_strings:
        raise _over("stop", len(raw.stop), "strings", sizes.max_stop_strings, "--max-stop-strings")
    num_stop_bytes = sum(utf8_len(s) for s in raw.stop)
    if num_stop_bytes > sizes.max_stop_bytes:
        raise _over("stop", num_stop_bytes, "bytes", sizes.max_stop_bytes, "--max-stop-bytes")
    if len(raw.stop_token_ids) > sizes.max_stop_token_ids:
        raise _over("stop_token_ids", len(raw.stop_token_ids), "ids", sizes.max_stop_token_ids,
                    "--max-stop-token-ids")
    if utf8_len(request_id) > MAX_REQUEST_ID_BYTES:
        raise invalid(f"request_id has {utf8_len(request_id)} bytes; at most {MAX_REQUEST_ID_BYTES}")


def _context_error(num_tokens: int, limits: Limits) -> RequestError:
    return invalid(
        f"the prompt has {num_tokens} tokens but the model's context is {limits.max_model_len} "
        f"tokens (the executor's --max-model-len); send at most {limits.max_model_len - 1}"
    )


def check_prompt_len(num_tokens: int, limits: Limits) -> None:
    """The token count, as soon as tokenization knows it (before the ids are even listed)."""
    if num_tokens >= limits.max_model_len:
        raise _context_error(num_tokens, limits)


def check_prompt(token_ids, limits: Limits) -> None:
    """The tokenized prompt: non-empty, within the context, every id in the vocabulary."""
    if len(token_ids) == 0:
        raise invalid(_EMPTY)
    check_prompt_len(len(token_ids), limits)
    bad = [t for t in token_ids if not 0 <= t < limits.vocab_size]
    if bad:
        raise invalid(
            f"prompt has token ids outside the vocabulary [0, {limits.vocab_size}): {bad[:5]}"
        )


def check_detokenize_ids(token_ids, limits: Limits) -> list[int]:
    """Detokenize's ids (the wire's repeated field): at most the model's context, each in the
    vocabulary; returned as a list."""
    if len(token_ids) > limits.max_model_len:
        raise invalid(f"Detokenize got {len(token_ids)} token ids; it answers up to the model's "
                      f"context of {limits.max_model_len}")
    bad = [t for t in token_ids if not 0 <= t < limits.vocab_size]
    if bad:
        raise invalid(f"token ids outside the vocabulary [0, {limits.vocab_size}): {bad[:5]}")
    return list(token_ids)


def build_sampling_params(raw: RawParams, prompt_len: int, limits: Limits) -> SamplingParams:
    """Validates the client's parameters and fills the defaults (max_tokens, seed, ...)."""
    n = 1 if raw.n is None else raw.n
    if n < 1:
        raise invalid(f"n must be at least 1, got {n}")
    room = limits.max_model_len - prompt_len
    shared = (prompt_len - 1) // limits.block_size if n > 1 and limits.prefix_caching else 0
    if raw.max_tokens is None:  # fill the context, but no further than the KV cache could hold
        # all n samples (they share the prompt's full blocks; the last sampled token needs no
        # slot: see max_blocks_needed)
        per_sample = shared + (limits.num_usable_blocks - shared) // n
        cache_room = per_sample * limits.block_size + 1 - prompt_len
        max_tokens = min(room, cache_room) if cache_room > 0 else room
    else:
        max_tokens = raw.max_tokens
    if max_tokens <= 0:
        raise invalid("max_tokens must be at least 1 (leave it unset to fill the context)")
    if max_tokens > room:
        raise invalid(
            f"max_tokens={max_tokens} plus the prompt's {prompt_len} tokens exceeds the model's "
            f"context of {limits.max_model_len}; ask for at most {room}"
        )
    temperature = 1.0 if raw.temperature is None else raw.temperature
    if not math.isfinite(temperature) or temperature < 0:
        raise invalid(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    top_p = 1.0 if raw.top_p is None else raw.top_p
    if not (0.0 < top_p <= 1.0):
        raise invalid(f"top_p must be in (0, 1], got {top_p}")
    if raw.top_k < 0:
        raise invalid(f"top_k must be >= 0 (0 = off), got {raw.top_k}")
    bad = [t for t in raw.stop_token_ids if not 0 <= t < limits.vocab_size]
    if bad:
        raise invalid(f"stop_token_ids outside the vocabulary [0, {limits.vocab_size}): {bad[:5]}")
    if any(s == "" for s in raw.stop):
        raise invalid("stop strings must be non-empty")
    logprobs, prompt_logprobs = _logprobs(raw, limits)
    penalties = _penalties(raw)
    logit_bias = _logit_bias(raw.logit_bias, limits)
    _check_min_tokens(raw, max_tokens, limits)
    needed = max_blocks_needed(prompt_len, max_tokens, limits.max_model_len, limits.block_size)
    total = needed + (n - 1) * (needed - shared)  # each sample's own blocks past the shared ones
    if total > limits.num_usable_blocks:
        what = f"{n} samples of {needed} KV blocks sharing {shared}" if n > 1 else f"{needed} KV blocks"
        raise RequestError(
            "RESOURCE_EXHAUSTED",
            f"the request needs up to {total} KV blocks ({what}; {prompt_len} prompt + "
            f"{max_tokens} new tokens) but the cache holds {limits.num_usable_blocks}; lower "
            f"max_tokens{', n' if n > 1 else ''} or the prompt",
        )
    seed = random.getrandbits(63) if raw.seed is None else raw.seed
    return SamplingParams(
        max_tokens=max_tokens, temperature=temperature, top_k=raw.top_k, top_p=top_p,
        seed=seed, stop=tuple(raw.stop), stop_token_ids=tuple(raw.stop_token_ids),
        ignore_eos=raw.ignore_eos, include_stop_str_in_output=raw.include_stop_str_in_output,
        n=n, logprobs=logprobs, prompt_logprobs=prompt_logprobs, **penalties,
        logit_bias=logit_bias, min_tokens=raw.min_tokens,
    )


def _logprobs(raw: RawParams, limits: Limits) -> tuple[int | None, int | None]:
    """(alternatives per generated token, per prompt token); None = not asked."""
    most = limits.max_logprobs
    if raw.top_logprobs and not raw.logprobs:
        raise invalid(f"top_logprobs={raw.top_logprobs} needs logprobs: set logprobs to true")
    if not 0 <= raw.top_logprobs <= most:
        raise invalid(f"top_logprobs={raw.top_logprobs}: the server returns 0 to {most} "
                      "alternatives per position (GetModelInfoResponse.max_logprobs)")
    if raw.prompt_logprobs is not None and not 0 <= raw.prompt_logprobs <= most:
        raise invalid(f"prompt_logprobs={raw.prompt_logprobs}: the server returns 0 to {most} "
                      "alternatives per position (GetModelInfoResponse.max_logprobs)")
    return (raw.top_logprobs if raw.logprobs else None), raw.prompt_logprobs


def _penalties(raw: RawParams) -> dict[str, float]:
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(raw, name)
        if not -2.0 <= value <= 2.0:  # NaN fails too
            raise invalid(f"{name} must be in [-2, 2] (0 = off), got {value}")
    repetition = 1.0 if raw.repetition_penalty is None else raw.repetition_penalty
    if not (math.isfinite(repetition) and repetition > 0):
        raise invalid(f"repetition_penalty must be a finite number > 0 (1 = off), got {repetition}")
    if not 0.0 <= raw.min_p <= 1.0:
        raise invalid(f"min_p must be in [0, 1] (0 = off), got {raw.min_p}")
    return dict(presence_penalty=raw.presence_penalty, frequency_penalty=raw.frequency_penalty,
                repetition_penalty=repetition, min_p=raw.min_p)


def _logit_bias(bias: Mapping[int, float], limits: Limits) -> tuple[tuple[int, float], ...]:
    if len(bias) > limits.max_logit_bias:  # before looking at any entry
        raise invalid(f"logit_bias has {len(bias)} entries; the limit is {limits.max_logit_bias} "
                      "(GetModelInfoResponse.max_logit_bias)")
    items = sorted(bias.items())
    bad = [t for t, _ in items if not 0 <= t < limits.vocab_size]
    if bad:
        raise invalid(f"logit_bias has token ids outside the vocabulary [0, {limits.vocab_size}): {bad[:5]}")
    bad = [(t, b) for t, b in items if not -100.0 <= b <= 100.0]
    if bad:
        raise invalid(f"logit_bias values must be in [-100, 100]; got {bad[:5]}")
    return tuple(items)


def _check_min_tokens(raw: RawParams, max_tokens: int, limits: Limits) -> None:
    if raw.min_tokens > max_tokens:
        raise invalid(f"min_tokens={raw.min_tokens} exceeds max_tokens={max_tokens}")
    if raw.min_tokens > 0:  # it masks the EOS ids (unless ignore_eos) and the stop token ids
        eos = () if raw.ignore_eos else limits.eos_token_ids
        num_ids = len(set(eos) | set(raw.stop_token_ids))
        if num_ids > limits.max_min_tokens_stop_ids:
            raise invalid(f"min_tokens masks the EOS and stop_token_ids, {num_ids} ids here; the "
                          f"executor masks at most {limits.max_min_tokens_stop_ids}: send fewer "
                          "stop_token_ids")
