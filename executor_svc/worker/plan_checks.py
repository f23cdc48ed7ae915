"""Checks of a step plan against the executor's rows, before any of it is applied.

Only the authenticated scheduler sends plans, but a bug there must not corrupt other
requests: every field that indexes memory (request rows, block ids, token ids, positions) or
feeds the sampler is checked here, on the state as it is before the plan.

Two kinds of fault. One that no single row explains (an id scheduled twice, ragged columns,
a size limit over max_num_seqs / max_num_batched_tokens, draft columns that do not add up)
raises PlanError naming the field, and nothing of the plan is applied. One of a row (a new
request's fields or blocks, a cached row that is not running, its span or its drafts) fails
that row alone: the row is dropped from the plan (a cached row is forgotten, as if finished,
since the scheduler can no longer know what it holds), the checks run again on the rest, and
CheckedPlan says which rows failed and why. Other requests' rows, block tables and KV are
never touched by a refused row.

Forgetting is idempotent: finished and preempted ids the executor does not hold are ignored
(after a refused plan the scheduler finishes requests this executor never added).
The checks are whole-array numpy over the cached rows: a 256-row decode step costs tens of µs;
each failed row costs one more pass (rare: the scheduler's validation refuses what it can).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from executor_svc.sample.rows import SamplingRows
from executor_svc.worker.input_batch import InputBatch
from executor_svc.worker.new_request_checks import check_new_request
from step_protocol.domain import ExecutorInfo, StepPlan
from step_protocol.plan_rows import without_rows


class PlanError(ValueError):
    """A step plan the executor refuses; nothing of it was applied."""


class RowError(PlanError):
    """One row of a plan the executor refuses: that row alone fails (check_plan drops it)."""

    def __init__(self, req_id: int, message: str):
        super().__init__(message)
        self.req_id = req_id


@dataclass
class CheckedPlan:
    """A plan that passed check_plan, with what the checks looked up (applying it repeats none)."""

    plan: StepPlan  # what runs: the plan less its failed rows (a failed cached row finished)
    cached_rows: np.ndarray  # [C] int64: persistent rows of plan.cached_requests.req_ids
    num_new_blocks: np.ndarray  # [C] int64: plan.cached_requests.num_new_blocks
    num_drafts: np.ndarray | None = None  # [C] int64 draft tokens per cached row; None = none
    chained: np.ndarray | None = None  # [C] bool: chained verify rows (spec_decode/verify.py); None = none
    failed: list[tuple[int, str]] = field(default_factory=list)  # (req_id, why) of dropped rows


def check_plan(plan: StepPlan, batch: InputBatch, sampling: SamplingRows, info: ExecutorInfo) -> CheckedPlan:
    """Raises PlanError for a fault of the whole plan; drops each row that fails (RowError),
    see the module's docstring. Changes nothing."""
    gone = set(plan.finished_req_ids) | set(plan.preempted_req_ids)
    _check_ids(plan, batch, gone)
    num_scheduled = _check_columns(plan)
    _check_sizes(plan, batch, info, gone, int(num_scheduled.sum()))
    _check_draft_columns(plan, info)
    failed: list[tuple[int, str]] = []
    while True:  # a pass per failed row: the rows left are checked again without it
        try:
            checked = _check_rows(plan, batch, sampling, info)
        except RowError as e:
            if e.req_id not in plan.scheduled_req_ids:  # would never end: not a row's fault
                raise PlanError(str(e)) from None
            failed.append((e.req_id, str(e)))
            plan = without_rows(plan, [e.req_id], forget=True)
            continue
        checked.failed = failed
        return checked


def _check_rows(plan: StepPlan, batch: InputBatch, sampling: SamplingRows, info: ExecutorInfo) -> CheckedPlan:
    """The checks of single rows, on a plan whose columns agree; RowError for the first."""
    cached_rows, num_scheduled, num_new_blocks = _cached_columns(plan, batch)
    for new in plan.new_requests:
        try:
            check_new_request(new, info, batch.max_blocks_per_seq)
        except ValueError as e:  # its fields: this row's fault alone
            raise RowError(new.req_id, str(e)) from None
    _check_block_ids(plan, num_new_blocks, info.num_blocks)
    num_drafts = _check_drafts(plan, cached_rows, num_scheduled, batch, sampling, info)
    chained = _check_chained(plan, num_drafts)
    _check_cached_spans(plan, cached_rows, num_scheduled, num_new_blocks, batch, info,
                        0 if num_drafts is None else num_drafts)
    return CheckedPlan(plan, cached_rows, num_new_blocks, num_drafts, chained)


def _check_draft_columns(plan: StepPlan, info: ExecutorInfo) -> None:
    """The draft columns fit the cached rows (speculative decoding, spec_decode/verify.py)."""
    num_cached = len(plan.cached_requests.req_ids)
    if len(plan.draft_chained) > num_cached:
        raise PlanError(f"draft_chained has {len(plan.draft_chained)} entries for {num_cached} cached rows")
    if not plan.num_draft_tokens and not plan.draft_token_ids:
        return
    counts = np.asarray(plan.num_draft_tokens, dtype=np.int64).reshape(-1)
    if len(counts) > num_cached or (counts < 0).any():
        raise PlanError(f"num_draft_tokens {list(counts[:8])} do not fit {num_cached} cached rows")
    if info.draft_model_path and plan.draft_token_ids:  # its draft model proposes (spec_decode/draft.py)
        raise PlanError("draft_token_ids sent to an executor with a draft model: its plans carry "
                        "num_draft_tokens only")
    if not info.draft_model_path and int(counts.sum()) != len(plan.draft_token_ids):
        raise PlanError(f"num_draft_tokens {list(counts[:8])} (for {num_cached} cached rows) do not "
                        f"match {len(plan.draft_token_ids)} draft_token_ids")


def _check_drafts(plan: StepPlan, rows: np.ndarray, n: np.ndarray, batch: InputBatch, rs: SamplingRows,
                  info: ExecutorInfo) -> np.ndarray | None:
    """Draft tokens (speculative decoding, spec_decode/verify.py): [C] counts, or None without any.
    A verify row computes 1 + d tokens from its last sampled or last known token, with
    sampling the verifier implements (no logits processor, no logprobs). The columns were
    checked (_check_draft_columns)."""
    if not plan.num_draft_tokens and not plan.draft_token_ids:
        return None
    c = plan.cached_requests
    d = np.zeros(len(c.req_ids), dtype=np.int64)
    d[:len(plan.num_draft_tokens)] = plan.num_draft_tokens
    ids = np.asarray(plan.draft_token_ids, dtype=np.int64)
    outside = np.flatnonzero((ids < 0) | (ids >= info.vocab_size))
    if len(outside):  # the row owning draft k: the first whose cumulative count passes k
        owner = int(np.searchsorted(np.cumsum(d), outside[0], side="right"))
        raise RowError(c.req_ids[owner], f"cached request {c.req_ids[owner]}: draft token id "
                       f"{ids[outside[0]]} is outside the vocabulary (0 to {info.vocab_size - 1})")
    bad = np.flatnonzero((d > 0) & ((n != d + 1) | (batch.num_computed[rows] + 1 < batch.num_known[rows])
                                    | rs.uses_processors[rows] | (rs.logprobs[rows] >= 0) | rs.uses_grammar[rows]))
    if len(bad):
        i = int(bad[0])
        raise RowError(c.req_ids[i], f"cached request {c.req_ids[i]}: {d[i]} drafts need a decode "
                       f"row of {d[i] + 1} tokens without logits processors, logprobs or a grammar")
    return d


def _check_chained(plan: StepPlan, num_drafts: np.ndarray | None) -> np.ndarray | None:
    """Chained verify rows (spec_decode/verify.py): [C] bool, or None without any; a chained row has
    drafts (the plan's, or as many as the draft model proposes)."""
    if not plan.draft_chained:
        return None
    flags = np.asarray(plan.draft_chained, dtype=bool).reshape(-1)
    chained = np.zeros(len(plan.cached_requests.req_ids), dtype=bool)
    chained[:len(flags)] = flags
    bad = np.flatnonzero(chained & (num_drafts == 0)) if num_drafts is not None else np.flatnonzero(chained)
    if len(bad):
        rid = plan.cached_requests.req_ids[int(bad[0])]
        raise RowError(rid, f"cached request {rid} is a chained verify row without drafts")
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


def _check_columns(plan: StepPlan) -> np.ndarray:
    """The cached rows' columns agree; returns num_scheduled_tokens, [C] int64."""
    c = plan.cached_requests
    num_scheduled = np.asarray(c.num_scheduled_tokens, dtype=np.int64).reshape(-1)
    num_new_blocks = np.asarray(c.num_new_blocks, dtype=np.int64).reshape(-1)
    if not len(c.req_ids) == len(num_scheduled) == len(num_new_blocks):
        raise PlanError(f"cached_requests: {len(c.req_ids)} req_ids, {len(num_scheduled)} "
                        f"num_scheduled_tokens, {len(num_new_blocks)} num_new_blocks")
    if (num_new_blocks < 0).any() or int(num_new_blocks.sum()) != len(c.new_block_ids):
        raise PlanError(f"cached_requests: num_new_blocks add up to {int(num_new_blocks.sum())}, "
                        f"new_block_ids holds {len(c.new_block_ids)}")
    return num_scheduled


def _cached_columns(plan: StepPlan, batch: InputBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, num_scheduled_tokens, num_new_blocks), each [C] int64, of rows that are running
    and compute something."""
    c = plan.cached_requests
    num_scheduled = np.asarray(c.num_scheduled_tokens, dtype=np.int64).reshape(-1)
    num_new_blocks = np.asarray(c.num_new_blocks, dtype=np.int64).reshape(-1)
    bad = np.flatnonzero(num_scheduled <= 0)
    if len(bad):
        i = int(bad[0])
        raise RowError(c.req_ids[i], f"cached request {c.req_ids[i]}: num_scheduled_tokens is {num_scheduled[i]}")
    try:
        rows = batch.rows_of(c.req_ids)
    except KeyError as e:
        # not running here (e.g. refused in a plan sent before the scheduler read that result)
        missing = next(r for r in c.req_ids if r not in batch.requests)
        raise RowError(missing, e.args[0]) from None
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


def _check_block_ids(plan: StepPlan, num_new_blocks: np.ndarray, num_blocks: int) -> None:
    """Every block a plan hands out is a real block: 1 to num_blocks - 1 (0 is the null block
    that padded rows write)."""
    for new in plan.new_requests:
        bad = _first_outside(new.block_ids, num_blocks)
        if bad is not None:
            raise RowError(new.req_id, f"new request {new.req_id}: block id {bad} is outside 1 to {num_blocks - 1}")
    c = plan.cached_requests
    ids = np.asarray(c.new_block_ids, dtype=np.int64)
    bad_at = np.flatnonzero((ids < 1) | (ids >= num_blocks))
    if len(bad_at):
        owner = int(np.searchsorted(np.cumsum(num_new_blocks), bad_at[0], side="right"))
        raise RowError(c.req_ids[owner], f"cached request {c.req_ids[owner]}: block id {ids[bad_at[0]]} "
                       f"is outside 1 to {num_blocks - 1}")


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
        raise RowError(rid, f"cached request {rid}: {num_blocks[i]} blocks > {batch.max_blocks_per_seq} per request")
    if past_blocks[i]:
        raise RowError(rid, f"cached request {rid}: {end[i]} tokens exceed its {num_blocks[i]} blocks "
                       f"or max_model_len {info.max_model_len}")
    raise RowError(rid, f"cached request {rid}: num_scheduled_tokens {n[i]} from position {start[i]} "
                   f"go past its {known[i]} known tokens (only a lone decode token may follow them)")
