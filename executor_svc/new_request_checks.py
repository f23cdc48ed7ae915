"""The checks of one new request's own fields (plan_checks.py runs them on every new row).

A fault here is that request's alone: plan_checks drops its row and runs the rest of the plan.
Each error names the request and the field.
"""

from __future__ import annotations

import math

import numpy as np

from step_protocol.domain import ExecutorInfo, NewRequestData, SamplerParams


class NewRequestError(ValueError):
    """A field of one new request the executor cannot run."""


def check_new_request(new: NewRequestData, info: ExecutorInfo, max_blocks_per_seq: int) -> None:
    """Raises NewRequestError for the first field of `new` the executor cannot run."""
    rid, n, computed = new.req_id, new.num_scheduled_tokens, new.num_computed_tokens
    num_known, num_blocks = len(new.token_ids), len(new.block_ids)
    if not 0 < num_known <= info.max_model_len:
        raise NewRequestError(f"new request {rid}: {num_known} token_ids (need 1 to max_model_len "
                              f"{info.max_model_len})")
    tokens = np.asarray(new.token_ids, dtype=np.int64)
    outside = np.flatnonzero((tokens < 0) | (tokens >= info.vocab_size))
    if len(outside):
        raise NewRequestError(f"new request {rid}: token id {tokens[outside[0]]} is outside the "
                              f"vocabulary (0 to {info.vocab_size - 1})")
    if n <= 0:
        raise NewRequestError(f"new request {rid}: num_scheduled_tokens is {n}")
    # a new row has no sampled token to feed: every token it computes must have been sent
    if computed < 0 or computed + n > num_known:
        raise NewRequestError(f"new request {rid}: num_computed_tokens {computed} + num_scheduled_tokens "
                              f"{n} go past its {num_known} token_ids")
    if num_blocks > max_blocks_per_seq:
        raise NewRequestError(f"new request {rid}: {num_blocks} block_ids > {max_blocks_per_seq} per request")
    if computed + n > num_blocks * info.block_size:
        raise NewRequestError(f"new request {rid}: {computed + n} tokens do not fit in its {num_blocks} "
                              f"blocks of {info.block_size}")
    if not 0 <= new.num_prompt_tokens <= num_known:
        raise NewRequestError(f"new request {rid}: num_prompt_tokens {new.num_prompt_tokens} outside 0 to "
                              f"its {num_known} token_ids")
    _check_sampler(rid, new.sampler_params)
    _check_processors(rid, new.sampler_params, info)


def _check_processors(rid: int, s: SamplerParams, info: ExecutorInfo) -> None:
    """The logits processors' and logprobs' fields: they index the vocabulary and fixed-width
    per-row tables, and feed the logits (a NaN would poison a row's every token)."""
    def refuse(what: str) -> None:
        raise NewRequestError(f"new request {rid}: {what}")

    for name in ("presence_penalty", "frequency_penalty"):
        if not math.isfinite(getattr(s, name)):
            refuse(f"{name} {getattr(s, name)} is not finite")
    if not (math.isfinite(s.repetition_penalty) and s.repetition_penalty > 0):
        refuse(f"repetition_penalty {s.repetition_penalty} (need a finite value > 0)")
    if not 0 <= s.min_p <= 1:
        refuse(f"min_p {s.min_p} (need 0 <= min_p <= 1)")
    if len(s.logit_bias) > info.max_logit_bias:
        refuse(f"{len(s.logit_bias)} logit_bias entries > {info.max_logit_bias}")
    ids = [t for t, _ in s.logit_bias]
    if any(not 0 <= t < info.vocab_size for t in ids) or len(set(ids)) != len(ids):
        refuse(f"logit_bias token ids must be distinct and in 0 to {info.vocab_size - 1}")
    if not all(math.isfinite(b) for _, b in s.logit_bias):
        refuse("a logit_bias value is not finite")
    if s.min_tokens < 0 or len(s.min_tokens_stop_ids) > info.max_min_tokens_stop_ids:
        refuse(f"min_tokens {s.min_tokens} with {len(s.min_tokens_stop_ids)} stop ids (need "
               f"min_tokens >= 0 and at most {info.max_min_tokens_stop_ids} ids)")
    if any(not 0 <= t < info.vocab_size for t in s.min_tokens_stop_ids):
        refuse(f"min_tokens_stop_ids outside 0 to {info.vocab_size - 1}")
    for name in ("logprobs", "prompt_logprobs"):
        if not -1 <= getattr(s, name) <= info.max_logprobs:
            refuse(f"{name} {getattr(s, name)} (need -1 to max_logprobs {info.max_logprobs})")


def _check_sampler(rid: int, s: SamplerParams) -> None:
    if not (math.isfinite(s.temperature) and s.temperature >= 0):
        raise NewRequestError(f"new request {rid}: temperature {s.temperature} (need a finite value >= 0)")
    if not (math.isfinite(s.top_p) and 0 < s.top_p <= 1):
        raise NewRequestError(f"new request {rid}: top_p {s.top_p} (need 0 < top_p <= 1)")
    if s.top_k < 0:
        raise NewRequestError(f"new request {rid}: top_k {s.top_k} (need >= 0; 0 = no cut)")
