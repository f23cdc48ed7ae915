"""The checks of one new request's own fields (plan_checks.py runs them on every new row).

A fault here is that request's alone: plan_checks drops its row and runs the rest of the plan.
Each error names the request and the field.
"""

from __future__ import annotations

import numpy as np

from step_protocol.domain import ExecutorInfo, NewRequestData
from step_protocol.sampler_checks import SamplerParamsError, check_sampler


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
    try:  # the one definition both services use (the scheduler's validation runs it too)
        check_sampler(new.sampler_params, info)
    except SamplerParamsError as e:
        raise NewRequestError(f"new request {rid}: {e}") from None
