"""Applying a checked step plan to the persistent rows: the step's first change of state.

A row that fails while its state is set up (InputBatch.add or Sampler.add_request raised: a
value its arrays cannot take, its sampling state) fails alone, as a row the checks refused
does: its add is undone (both are all or nothing), the row is dropped from the plan, and the
rest of the plan runs. The plan that runs (`Admitted.plan`) is what a tensor-parallel rank 0 sends to its
other ranks, so every rank applies exactly the same rows.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from executor_svc.sample.sampler import Sampler
from executor_svc.worker.input_batch import InputBatch
from executor_svc.worker.plan_checks import check_plan
from executor_svc.worker.step_inputs import Scheduled
from step_protocol.domain import ExecutorInfo, StepPlan
from step_protocol.plan_rows import without_rows

log = logging.getLogger(__name__)


@dataclass
class Admitted:
    """A plan applied to the rows: what the step computes and which rows failed."""

    scheduled: Scheduled  # rows in plan order: new requests, then cached ones
    plan: StepPlan  # the plan that runs: the one sent, less its failed rows
    failed: list[tuple[int, str]]  # (req_id, why) of each failed row, in the order found
    # SteadyDecode's (steady.py: the last step's rows again): each row's new blocks; None otherwise
    steady: np.ndarray | None = None


def admit(plan: StepPlan, batch: InputBatch, sampler: Sampler, info: ExecutorInfo) -> Admitted:
    """Checks the plan (plan_checks.py: PlanError and nothing changed, or rows dropped), then
    drops finished / preempted rows, adds new requests (their rows, then their sampling state)
    and applies the block deltas of the cached ones (columns, used as they come)."""
    checked = check_plan(plan, batch, sampler.rows, info)
    plan, failed = checked.plan, checked.failed
    for req_id, why in failed:
        log.warning("step %d: request %d failed alone: %s", plan.step_id, req_id, why)
    for req_id in (*plan.finished_req_ids, *plan.preempted_req_ids):
        if (state := batch.requests.get(req_id)) is not None:
            sampler.remove(state.row)
        batch.remove(req_id)
    not_added = []
    for new in plan.new_requests:
        try:
            state = batch.add(new)
            try:
                sampler.add_request(state.row, new)
            except BaseException:
                batch.remove(new.req_id)
                raise
        except Exception as e:  # noqa: BLE001 - this request's trouble: it fails alone
            log.error("step %d: request %d failed alone: its row could not be set up",
                      plan.step_id, new.req_id, exc_info=e)
            not_added.append(new.req_id)
            failed.append((new.req_id, f"new request {new.req_id}: {type(e).__name__}: {e}"))
    if not_added:  # cached rows keep their indexes: only new requests go
        plan = without_rows(plan, not_added)
    new_rows = [batch.requests[new.req_id].row for new in plan.new_requests]
    cached = plan.cached_requests
    cached_rows, num_new_blocks = checked.cached_rows, checked.num_new_blocks  # [C] int64
    if num_new_blocks.any():  # usually no row crosses into a new block
        ends = np.cumsum(num_new_blocks)  # row i owns new_block_ids[ends[i] - n_i:ends[i]]
        for i in np.flatnonzero(num_new_blocks).tolist():
            start, end = int(ends[i] - num_new_blocks[i]), int(ends[i])
            batch.append_blocks(batch.states[cached_rows[i]], cached.new_block_ids[start:end])
    rows = np.concatenate([np.array(new_rows, dtype=np.int64), cached_rows])
    counts = np.concatenate([
        np.array([new.num_scheduled_tokens for new in plan.new_requests], dtype=np.int64),
        np.asarray(cached.num_scheduled_tokens, dtype=np.int64)])
    drafts, chained = checked.num_drafts, checked.chained
    if drafts is not None:
        drafts = np.concatenate([np.zeros(len(new_rows), dtype=np.int64), drafts])
    if chained is not None:
        chained = np.concatenate([np.zeros(len(new_rows), dtype=bool), chained])
    return Admitted(Scheduled(rows, counts, drafts, chained), plan, failed)
