"""Checks of a step plan against the executor's rows, before any of it is applied.

Only the authenticated scheduler sends plans, but a bug there must not corrupt other
requests: every field that indexes memory (request rows, block ids, token ids, positions) or
feeds the sampler is checked here, on the state as it is before the plan. A plan that fails
raises PlanError naming the field, and nothing of it is applied: other requests' rows, block
tables and KV stay as they were, and the next good plan runs normally.

Forgetting is idempotent: finished and preempted ids the executor does not hold are ignored
(after a refused plan the scheduler finishes requests this executor never added).
The checks are whole-array numpy over the cached rows: a 256-row decode step costs tens of µs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from executor_svc.input_batch import InputBatch
from step_protocol.domain import ExecutorInfo, NewRequestData, SamplerParams, StepPlan


class PlanError(ValueError):
    """A step plan the executor refuses; nothing of it was applied."""


@dataclass
class CheckedPlan:
    """A plan that passed check_plan, with what the checks looked up (applying it repeats none)."""

    plan: StepPlan
    cached_rows: np.ndarray  # [C] int64: persistent rows of plan.cached_requests.req_ids
    num_new_blocks: np.ndarray  # [C] int64: plan.cached_requests.num_new_blocks
    num_drafts: np.ndarray | None = None  # [C] int64 draft tokens per cached row; None = none
    chained: np.ndarray | None = None  # [C] bool: chained verify rows (spec_verify.py); None = none


def check_plan(plan: StepPlan, batch: InputBatch, info: ExecutorInfo) -> CheckedPlan:
    """Raises PlanError for the first thing wrong with `plan`; changes nothing."""
    gone = set(plan.finished_req_ids) | set(plan.preempted_req_ids)
    _check_ids(plan, batch, gone)
    cached_rows, num_scheduled, num_new_blocks = _cached_columns(plan, batch)
    _check_sizes(plan, batch, info, gone, int(num_scheduled.sum()))
    for new in plan.new_requests:
        _check_new_request(new, info, batch.max_blocks_per_seq)
    _check_block_ids(plan, num_new_blocks, info.num_blocks)
    num_drafts = _check_drafts(plan, cached_rows, num_scheduled, batch, info)
    chained = _check_chained(plan, num_drafts, info)
    _check_cached_spans(plan, cached_rows, num_scheduled, num_new_blocks, batch, info,
                        0 if num_drafts is None else num_drafts)
    return CheckedPlan(plan, cached_rows, num_new_blocks, num_drafts, chained)


def _check_drafts(plan: StepPlan, rows: np.ndarray, n: np.ndarray, batch: InputBatch,
                  info: ExecutorInfo) -> np.ndarray | None:
    """Draft tokens (speculative decoding, spec_verify.py): [C] counts, or None without any.
    A verify row computes 1 + d tokens from its last sampled or last known token, with
    sampling the verifier implements (no logits processor, no logprobs)."""
    if not plan.num_draft_tokens and not plan.draft_token_ids:
        return None
    num_cached = len(plan.cached_requests.req_ids)
    d = np.zeros(num_cached, dtype=np.int64)
    counts = np.asarray(plan.num_draft_tokens, dtype=np.int64).reshape(-1)
    if len(counts) > num_cached or (counts < 0).any():
        raise PlanError(f"num_draft_tokens {list(counts[:8])} do not fit {num_cached} cached rows")
    if info.draft_model_path and plan.draft_token_ids:  # its draft model proposes (spec_draft.py)
        raise PlanError("draft_token_ids sent to an executor with a draft model: its plans carry "
                        "num_draft_tokens only")
    if not info.draft_model_path and int(counts.sum()) != len(plan.draft_token_ids):
        raise PlanError(f"num_draft_tokens {list(counts[:8])} (for {num_cached} cached rows) do not "
                        f"match {len(plan.draft_token_ids)} draft_token_ids")
    d[:len(counts)] = counts
    ids = np.asarray(plan.draft_token_ids, dtype=np.int64)
    if ((ids < 0) | (ids >= info.vocab_size)).any():
        raise PlanError(f"a draft token id is outside the vocabulary (0 to {info.vocab_size - 1})")
    rs = batch.sampling
    bad = np.flatnonzero((d > 0) & ((n != d + 1) | (batch.num_computed[rows] + 1 < batch.num_known[rows])
                                    | rs.uses_processors[rows] | (rs.logprobs[rows] >= 0)))
    if len(bad):
        i = int(bad[0])
        raise PlanError(f"cached request {plan.cached_requests.req_ids[i]}: {d[i]} drafts need a decode "
                        f"row of {d[i] + 1} tokens without logits processors or logprobs")
    return d


def _check_chained(plan: StepPlan, num_drafts: np.ndarray | None, info: ExecutorInfo) -> np.ndarray | None:
    """Chained verify rows (spec_verify.py): [C] bool, or None without any; a chained row has
    drafts (the plan's, or as many as the draft model proposes)."""
    if not plan.draft_chained:
        return None
    flags = np.asarray(plan.draft_chained, dtype=bool).reshape(-1)
    num_cached = len(plan.cached_requests.req_ids)
    if len(flags) > num_cached:
        raise PlanError(f"draft_chained has {len(flags)} entries for {num_cached} cached rows")
    chained = np.zeros(num_cached, dtype=bool)
    chained[:len(flags)] = flags
    bad = np.flatnonzero(chained & (num_drafts == 0)) if num_drafts is not None else np.flatnonzero(chained)
    if len(bad):
        raise PlanError(f"cached request {plan.cached_requests.req_ids[int(bad[0])]} is a chained "
                        "verify row without drafts")
    return chained if chained.any() else None


def _check_ids(plan: StepPlan, batch: InputBatch, gone: set[int]) -> None:
    scheduled = plan.scheduled_req_ids
    if len(set(scheduled)) != len(scheduled):
        seen: set[int] = set()
        for req_id in scheduled:
            if req_id in seen:
                raise PlanError(f"request {req_id} is scheduled twice in one plan")
            seen.add(req_id)
    for new in plan.new_requests:
        if new.req_id in batch.requests and new.req_id not in gone:
            raise PlanError(f"new request {new.req_id} is already running on the executor")
    if gone and not gone.isdisjoint(plan.cached_requests.req_ids):
        req_id = next(r for r in plan.cached_requests.req_ids if r in gone)
        raise PlanError(f"cached request {req_id} is also finished or preempted in this plan")


def _cached_columns(plan: StepPlan, batch: InputBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, num_scheduled_tokens, num_new_blocks), each [C] int64, once the columns agree."""
    c = plan.cached_requests
    num_scheduled = np.asarray(c.num_scheduled_tokens, dtype=np.int64).reshape(-1)
    num_new_blocks = np.asarray(c.num_new_blocks, dtype=np.int64).reshape(-1)
    if not len(c.req_ids) == len(num_scheduled) == len(num_new_blocks):
        raise PlanError(f"cached_requests: {len(c.req_ids)} req_ids, {len(num_scheduled)} "
                        f"num_scheduled_tokens, {len(num_new_blocks)} num_new_blocks")
    if (num_new_blocks < 0).any() or int(num_new_blocks.sum()) != len(c.new_block_ids):
        raise PlanError(f"cached_requests: num_new_blocks add up to {int(num_new_blocks.sum())}, "
                        f"new_block_ids holds {len(c.new_block_ids)}")
    bad = np.flatnonzero(num_scheduled <= 0)
    if len(bad):
        i = int(bad[0])
        raise PlanError(f"cached request {c.req_ids[i]}: num_scheduled_tokens is {num_scheduled[i]}")
    try:
        rows = batch.rows_of(c.req_ids)
    except KeyError as e:
        raise PlanError(e.args[0]) from None
    return rows, num_scheduled, num_new_blocks


def _check_sizes(plan: StepPlan, batch: InputBatch, info: ExecutorInfo, gone: set[int],
                 num_cached_tokens: int) -> None:
    num_rows = len(plan.new_requests) + len(plan.cached_requests)
    num_tokens = num_cached_tokens + sum(max(new.num_scheduled_tokens, 0) for new in plan.new_requests)
    if num_rows > info.max_num_seqs:
        raise PlanError(f"{num_rows} scheduled requests > max_num_seqs {info.max_num_seqs}")
    if num_tokens > info.max_num_batched_tokens:
        raise PlanError(f"{num_tokens} scheduled tokens > max_num_batched_tokens {info.max_num_batched_tokens}")
    num_running = len(batch.requests) - sum(r in batch.requests for r in gone) + len(plan.new_requests)
    if num_running > batch.max_num_seqs:
        raise PlanError(f"{num_running} running requests after this plan > max_num_seqs {batch.max_num_seqs}")


def _check_new_request(new: NewRequestData, info: ExecutorInfo, max_blocks_per_seq: int) -> None:
    rid, n, computed = new.req_id, new.num_scheduled_tokens, new.num_computed_tokens
    num_known, num_blocks = len(new.token_ids), len(new.block_ids)
    if not 0 < num_known <= info.max_model_len:
        raise PlanError(f"new request {rid}: {num_known} token_ids (need 1 to max_model_len "
                        f"{info.max_model_len})")
    tokens = np.asarray(new.token_ids, dtype=np.int64)
    outside = np.flatnonzero((tokens < 0) | (tokens >= info.vocab_size))
    if len(outside):
        raise PlanError(f"new request {rid}: token id {tokens[outside[0]]} is outside the "
                        f"vocabulary (0 to {info.vocab_size - 1})")
    if n <= 0:
        raise PlanError(f"new request {rid}: num_scheduled_tokens is {n}")
    # a new row has no sampled token to feed: every token it computes must have been sent
    if computed < 0 or computed + n > num_known:
        raise PlanError(f"new request {rid}: num_computed_tokens {computed} + num_scheduled_tokens "
                        f"{n} go past its {num_known} token_ids")
    if num_blocks > max_blocks_per_seq:
        raise PlanError(f"new request {rid}: {num_blocks} block_ids > {max_blocks_per_seq} per request")
    if computed + n > num_blocks * info.block_size:
        raise PlanError(f"new request {rid}: {computed + n} tokens do not fit in its {num_blocks} "
                        f"blocks of {info.block_size}")
    if not 0 <= new.num_prompt_tokens <= num_known:
        raise PlanError(f"new request {rid}: num_prompt_tokens {new.num_prompt_tokens} outside 0 to "
                        f"its {num_known} token_ids")
    _check_sampler(rid, new.sampler_params)
    _check_processors(rid, new.sampler_params, info)


def _check_processors(rid: int, s: SamplerParams, info: ExecutorInfo) -> None:
    """The logits processors' and logprobs' fields: they index the vocabulary and fixed-width
    per-row tables, and feed the logits (a NaN would poison a row's every token)."""
    def refuse(what: str) -> None:
        raise PlanError(f"new request {rid}: {what}")

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
        raise PlanError(f"new request {rid}: temperature {s.temperature} (need a finite value >= 0)")
    if not (math.isfinite(s.top_p) and 0 < s.top_p <= 1):
        raise PlanError(f"new request {rid}: top_p {s.top_p} (need 0 < top_p <= 1)")
    if s.top_k < 0:
        raise PlanError(f"new request {rid}: top_k {s.top_k} (need >= 0; 0 = no cut)")


def _check_block_ids(plan: StepPlan, num_new_blocks: np.ndarray, num_blocks: int) -> None:
    """Every block a plan hands out is a real block: 1 to num_blocks - 1 (0 is the null block
    that padded rows write)."""
    for new in plan.new_requests:
        bad = _first_outside(new.block_ids, num_blocks)
        if bad is not None:
            raise PlanError(f"new request {new.req_id}: block id {bad} is outside 1 to {num_blocks - 1}")
    c = plan.cached_requests
    ids = np.asarray(c.new_block_ids, dtype=np.int64)
    bad_at = np.flatnonzero((ids < 1) | (ids >= num_blocks))
    if len(bad_at):
        owner = int(np.searchsorted(np.cumsum(num_new_blocks), bad_at[0], side="right"))
        raise PlanError(f"cached request {c.req_ids[owner]}: block id {ids[bad_at[0]]} is outside "
                        f"1 to {num_blocks - 1}")


def _first_outside(block_ids: list[int], num_blocks: int) -> int | None:
    ids = np.asarray(block_ids, dtype=np.int64)
    bad = np.flatnonzero((ids < 1) | (ids >= num_blocks))
    return int(ids[bad[0]]) if len(bad) else None


def _check_cached_spans(plan: StepPlan, rows: np.ndarray, n: np.ndarray, num_new_blocks: np.ndarray,
                        batch: InputBatch, info: ExecutorInfo, num_drafts: np.ndarray | int = 0) -> None:
    """Each cached row's chunk stays within its blocks (after this plan's), max_model_len and
    its known tokens, except a lone decode token right after them (fed from its last sample)."""
    start = batch.num_computed[rows]
    end = start + n
    known = batch.num_known[rows]
    num_blocks = batch.num_blocks[rows] + num_new_blocks
    too_many_blocks = num_blocks > batch.max_blocks_per_seq
    past_blocks = end > np.minimum(num_blocks * info.block_size, info.max_model_len)
    # a lone decode token, or a verify row: its last sampled (or last known) token + d drafts
    lone = (n == 1 + num_drafts) & (start + np.minimum(num_drafts, 1) >= known)
    past_known = (end > known) & ~lone
    bad = np.flatnonzero(too_many_blocks | past_blocks | past_known)
    if not len(bad):
        return
    i = int(bad[0])
    rid = plan.cached_requests.req_ids[i]
    if too_many_blocks[i]:
        raise PlanError(f"cached request {rid}: {num_blocks[i]} blocks > {batch.max_blocks_per_seq} per request")
    if past_blocks[i]:
        raise PlanError(f"cached request {rid}: {end[i]} tokens exceed its {num_blocks[i]} blocks "
                        f"or max_model_len {info.max_model_len}")
    raise PlanError(f"cached request {rid}: num_scheduled_tokens {n[i]} from position {start[i]} "
                    f"go past its {known[i]} known tokens (only a lone decode token may follow them)")
