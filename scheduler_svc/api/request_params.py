"""The one validation of a request's sampling parameters, for every door (gRPC, HTTP).

Each door parses its wire format into `RawParams` (the fields as the client sent them) and
calls `build_sampling_params`, which checks every field before any work and fills the
defaults. Floats are rounded to 32 bits first, as the step plan carries them, and checked
after rounding (1e39 would become inf, 1e-50 would become 0); integers are checked against
their wire widths. The last check is the executor's own (`step_protocol.sampler_checks`) on
the exact values that will cross: what passes here can never fail to encode or be refused by
the executor's plan checks. Every refusal names its field (`RequestError.param`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from llmserve.structured.constraint import Constraint
from scheduler_svc.api.validation import Limits, invalid
from scheduler_svc.core.kv_cache_manager import max_blocks_needed
from scheduler_svc.core.request import SamplingParams
from scheduler_svc.messages import RequestError
from step_protocol.sampler_checks import SamplerParamsError, check_sampler, float32

SEED_LIMIT = 1 << 64  # seeds are uint64 on both wires
MAX_BIAS = 100.0  # |logit_bias| (OpenAI's range)


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
    # structured outputs (each door builds it: llmserve.structured); compiled at admission
    constraint: Constraint | None = None
    # max_tokens when unset: None = fill the context (gRPC, chat); OpenAI's completions use 16
    # (capped by the room the prompt leaves)
    default_max_tokens: int | None = None


def _refuse(param: str, message: str) -> RequestError:
    """INVALID_ARGUMENT naming `param`, the message starting with it ("top_p=..." or "top_p ...")."""
    return invalid(param + (message if message.startswith("=") else " " + message), param)


def _f32(param: str, value: float) -> float:
    """The value as the plan will carry it; refused when that is not a finite number."""
    rounded = float32(value)
    if not math.isfinite(rounded):
        what = "is not a number" if math.isnan(value) else (
            "is infinite" if math.isinf(value) else "is past the 32-bit float range")
        raise invalid(f"{param} must be a finite number, got {value!r}, which {what}", param)
    return rounded


def build_sampling_params(raw: RawParams, prompt_len: int, limits: Limits) -> SamplingParams:
    """Validates the client's parameters and fills the defaults (max_tokens, seed, ...)."""
    n = 1 if raw.n is None else raw.n
    if n < 1:
        raise invalid(f"n must be at least 1, got {n}", "n")
    max_tokens = _max_tokens(raw, n, prompt_len, limits)
    temperature = 1.0 if raw.temperature is None else _f32("temperature", raw.temperature)
    if temperature < 0:
        raise invalid(f"temperature must be >= 0 (0 = greedy), got {raw.temperature!r}", "temperature")
    top_p = 1.0 if raw.top_p is None else _f32("top_p", raw.top_p)
    if not 0.0 < top_p <= 1.0:
        raise invalid(f"top_p must be in (0, 1] (as a 32-bit float), got {raw.top_p!r}", "top_p")
    if raw.top_k < 0:
        raise invalid(f"top_k must be >= 0 (0 = off), got {raw.top_k}", "top_k")
    top_k = 0 if raw.top_k >= limits.vocab_size else raw.top_k  # a cut past the vocabulary is none
    seed = random.getrandbits(63) if raw.seed is None else raw.seed
    if not 0 <= seed < SEED_LIMIT:
        raise invalid(f"seed must be in [0, 2^64 - 1] (unset = random), got {seed}", "seed")
    bad = [t for t in raw.stop_token_ids if not 0 <= t < limits.vocab_size]
    if bad:
        raise _refuse("stop_token_ids", f"outside the vocabulary [0, {limits.vocab_size}): {bad[:5]}")
    if any(s == "" for s in raw.stop):
        raise _refuse("stop", "strings must be non-empty")
    logprobs, prompt_logprobs = _logprobs(raw, limits)
    penalties = _penalties(raw)
    logit_bias = _logit_bias(raw.logit_bias, limits)
    if raw.min_tokens < 0:
        raise invalid(f"min_tokens must be >= 0, got {raw.min_tokens}", "min_tokens")
    if raw.min_tokens > max_tokens:
        raise _refuse("min_tokens", f"={raw.min_tokens} exceeds max_tokens={max_tokens}")
    _check_min_tokens_ids(raw, limits)
    _check_constraint(raw)
    # the field to change: max_tokens if the client set it, else n, else the prompt itself
    _check_blocks(n, prompt_len, max_tokens, limits,
                  "max_tokens" if raw.max_tokens is not None else "n" if n > 1 else "prompt")
    params = SamplingParams(
        max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
        seed=seed, stop=tuple(raw.stop), stop_token_ids=tuple(raw.stop_token_ids),
        ignore_eos=raw.ignore_eos, include_stop_str_in_output=raw.include_stop_str_in_output,
        n=n, logprobs=logprobs, prompt_logprobs=prompt_logprobs, **penalties,
        logit_bias=logit_bias, min_tokens=raw.min_tokens, constraint=raw.constraint,
    )
    try:  # the executor's own check, on what will cross (sample i's seed is seed + i mod 2^64)
        check_sampler(params.sampler_params(limits.eos_token_ids), limits)
    except SamplerParamsError as e:
        raise _refuse(e.field, f"cannot be run by the executor: {e}") from None
    return params


def _max_tokens(raw: RawParams, n: int, prompt_len: int, limits: Limits) -> int:
    room = limits.max_model_len - prompt_len
    if raw.max_tokens is not None:
        max_tokens = raw.max_tokens
    elif raw.default_max_tokens is not None:
        max_tokens = min(raw.default_max_tokens, room)
    else:  # fill the context, but no further than the KV cache could hold all n samples
        # (they share the prompt's full blocks; the last sampled token needs no slot: see
        # max_blocks_needed)
        shared = _shared_blocks(n, prompt_len, limits)
        per_sample = shared + (limits.num_usable_blocks - shared) // n
        cache_room = per_sample * limits.block_size + 1 - prompt_len
        max_tokens = min(room, cache_room) if cache_room > 0 else room
    if max_tokens <= 0:
        raise _refuse("max_tokens", f"={max_tokens}: need at least 1 (leave it unset to fill the context)")
    if max_tokens > room:
        raise _refuse("max_tokens", f"={max_tokens} plus the prompt's {prompt_len} tokens exceeds "
                      f"the model's context of {limits.max_model_len}; ask for at most {room}")
    return max_tokens


def _shared_blocks(n: int, prompt_len: int, limits: Limits) -> int:
    return (prompt_len - 1) // limits.block_size if n > 1 and limits.prefix_caching else 0


def _check_blocks(n: int, prompt_len: int, max_tokens: int, limits: Limits, param: str) -> None:
    shared = _shared_blocks(n, prompt_len, limits)
    needed = max_blocks_needed(prompt_len, max_tokens, limits.max_model_len, limits.block_size)
    total = needed + (n - 1) * (needed - shared)  # each sample's own blocks past the shared ones
    if total > limits.num_usable_blocks:
        what = f"{n} samples of {needed} KV blocks sharing {shared}" if n > 1 else f"{needed} KV blocks"
        raise RequestError(
            "RESOURCE_EXHAUSTED",
            f"the request needs up to {total} KV blocks ({what}; {prompt_len} prompt + "
            f"{max_tokens} new tokens) but the cache holds {limits.num_usable_blocks}; lower "
            f"max_tokens{', n' if n > 1 else ''} or the prompt", param,
        )


def _logprobs(raw: RawParams, limits: Limits) -> tuple[int | None, int | None]:
    """(alternatives per generated token, per prompt token); None = not asked."""
    most = limits.max_logprobs
    if raw.top_logprobs and not raw.logprobs:
        raise _refuse("top_logprobs", f"={raw.top_logprobs} needs logprobs: set logprobs to true")
    if not 0 <= raw.top_logprobs <= most:
        raise _refuse("top_logprobs", f"={raw.top_logprobs}: the server returns 0 to {most} "
                      "alternatives per position (GetModelInfoResponse.max_logprobs)")
    if raw.prompt_logprobs is not None and not 0 <= raw.prompt_logprobs <= most:
        raise _refuse("prompt_logprobs", f"={raw.prompt_logprobs}: the server returns 0 to {most} "
                      "alternatives per position (GetModelInfoResponse.max_logprobs)")
    return (raw.top_logprobs if raw.logprobs else None), raw.prompt_logprobs


def _penalties(raw: RawParams) -> dict[str, float]:
    values = {}
    for name in ("presence_penalty", "frequency_penalty"):
        value = _f32(name, getattr(raw, name))
        if not -2.0 <= value <= 2.0:
            raise invalid(f"{name} must be in [-2, 2] (0 = off), got {getattr(raw, name)!r}", name)
        values[name] = value
    repetition = 1.0 if raw.repetition_penalty is None else _f32("repetition_penalty", raw.repetition_penalty)
    if not repetition > 0:
        raise invalid("repetition_penalty must be a finite number > 0 (1 = off; as a 32-bit "
                      f"float), got {raw.repetition_penalty!r}", "repetition_penalty")
    min_p = _f32("min_p", raw.min_p)
    if not 0.0 <= min_p <= 1.0:
        raise invalid(f"min_p must be in [0, 1] (0 = off), got {raw.min_p!r}", "min_p")
    return dict(values, repetition_penalty=repetition, min_p=min_p)


def _logit_bias(bias: Mapping[int, float], limits: Limits) -> tuple[tuple[int, float], ...]:
    if len(bias) > limits.max_logit_bias:  # before looking at any entry
        raise _refuse("logit_bias", f"has {len(bias)} entries; the limit is {limits.max_logit_bias} "
                      "(GetModelInfoResponse.max_logit_bias)")
    items = sorted(bias.items())
    bad = [t for t, _ in items if not 0 <= t < limits.vocab_size]
    if bad:
        raise _refuse("logit_bias", f"has token ids outside the vocabulary [0, {limits.vocab_size}): {bad[:5]}")
    bad = [(t, b) for t, b in items if not -MAX_BIAS <= b <= MAX_BIAS]  # NaN fails too
    if bad:
        raise _refuse("logit_bias", f"values must be in [-100, 100]; got {bad[:5]}")
    return tuple((t, float32(b)) for t, b in items)


def _check_min_tokens_ids(raw: RawParams, limits: Limits) -> None:
    if raw.min_tokens > 0:  # it masks the EOS ids (unless ignore_eos) and the stop token ids
        eos = () if raw.ignore_eos else limits.eos_token_ids
        num_ids = len(set(eos) | set(raw.stop_token_ids))
        if num_ids > limits.max_min_tokens_stop_ids:
            raise _refuse("min_tokens", f"masks the EOS and stop_token_ids, {num_ids} ids here; the "
                          f"executor masks at most {limits.max_min_tokens_stop_ids}: send fewer "
                          "stop_token_ids")


def _check_constraint(raw: RawParams) -> None:
    """A grammar decides where its output ends (EOS is all it allows once complete): min_tokens
    and ignore_eos would have the model sample past it from an empty mask."""
    if raw.constraint is None:
        return
    for name, value in (("min_tokens", raw.min_tokens), ("ignore_eos", raw.ignore_eos)):
        if value:
            raise _refuse(name, f"={value} cannot be combined with {raw.constraint.param}: the "
                          "structured output ends where its grammar is complete")
