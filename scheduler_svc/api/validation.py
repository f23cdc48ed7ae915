"""Checks a request against the model's limits before it is admitted (no grpc here)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from scheduler_svc.core.kv_cache_manager import max_blocks_needed
from scheduler_svc.core.request import SamplingParams
from scheduler_svc.messages import RequestError


def invalid(message: str) -> RequestError:
    return RequestError("INVALID_ARGUMENT", message)


@dataclass(frozen=True)
class Limits:
    """What the served model and the KV pool allow."""

    max_model_len: int
    vocab_size: int
    block_size: int
    num_usable_blocks: int


@dataclass(frozen=True)
class RawParams:
    """Sampling fields as the client sent them; None = not set."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_k: int = 0
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False


def check_prompt(token_ids: list[int], limits: Limits) -> None:
    if not token_ids:
        raise invalid("the prompt is empty: send non-empty text, token ids or chat messages")
    bad = [t for t in token_ids if not 0 <= t < limits.vocab_size]
    if bad:
        raise invalid(
            f"prompt has token ids outside the vocabulary [0, {limits.vocab_size}): {bad[:5]}"
        )
    if len(token_ids) >= limits.max_model_len:
        raise invalid(
            f"the prompt has {len(token_ids)} tokens but the model's context is "
            f"{limits.max_model_len} tokens; send at most {limits.max_model_len - 1}"
        )


def build_sampling_params(raw: RawParams, prompt_len: int, limits: Limits) -> SamplingParams:
    """Validates the client's parameters and fills the defaults (max_tokens, seed, ...)."""
    room = limits.max_model_len - prompt_len
    if raw.max_tokens is None:  # fill the context, but no further than the KV cache could hold
        # (the last sampled token needs no slot: see max_blocks_needed)
        cache_room = limits.num_usable_blocks * limits.block_size + 1 - prompt_len
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
    needed = max_blocks_needed(prompt_len, max_tokens, limits.max_model_len, limits.block_size)
    if needed > limits.num_usable_blocks:
        raise RequestError(
            "RESOURCE_EXHAUSTED",
            f"the request needs up to {needed} KV blocks ({prompt_len} prompt + {max_tokens} new "
            f"tokens) but the cache holds {limits.num_usable_blocks}; lower max_tokens or the prompt",
        )
    seed = random.getrandbits(63) if raw.seed is None else raw.seed
    return SamplingParams(
        max_tokens=max_tokens, temperature=temperature, top_k=raw.top_k, top_p=top_p,
        seed=seed, stop=tuple(raw.stop), stop_token_ids=tuple(raw.stop_token_ids),
        ignore_eos=raw.ignore_eos,
    )
