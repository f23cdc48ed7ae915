"""A step plan less some of its rows: how one bad row fails alone (docs/contracts.md).

The executor drops a row it refuses or cannot prepare and runs the rest of the plan; the
scheduler drops a new request it cannot encode and sends the rest. Both cut the same columns
here, so the plan that runs is always a consistent plan.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from step_protocol.domain import CachedRequestData, StepPlan


def without_rows(plan: StepPlan, req_ids: Iterable[int], forget: bool = False) -> StepPlan:
    """`plan` without the rows of `req_ids`: their new requests, their cached rows with those
    rows' new blocks and drafts. forget: a dropped cached row's id is added to
    finished_req_ids, so whoever runs the plan forgets that row (the executor, and the other
    ranks of a tensor-parallel one, hold it no more). The columns must be consistent (the
    executor's plan checks have passed); the plan itself is not changed."""
    drop = set(req_ids)
    c = plan.cached_requests
    new_requests = [r for r in plan.new_requests if r.req_id not in drop]
    if drop.isdisjoint(c.req_ids):  # new requests only: the cached columns stay exactly as sent
        return replace(plan, new_requests=new_requests)
    cached, counts, draft_ids, chained = CachedRequestData(), [], [], []
    has_ids = bool(plan.draft_token_ids)  # else the executor's draft model proposes them
    block_at = draft_at = 0
    for i, req_id in enumerate(c.req_ids):
        blocks = c.new_block_ids[block_at:block_at + c.num_new_blocks[i]]
        block_at += c.num_new_blocks[i]
        d = plan.num_draft_tokens[i] if i < len(plan.num_draft_tokens) else 0
        drafts = plan.draft_token_ids[draft_at:draft_at + d] if has_ids else []
        draft_at += d
        if req_id in drop:
            continue
        cached.append(req_id, c.num_scheduled_tokens[i], blocks)
        counts.append(d)
        draft_ids += drafts
        chained.append(i < len(plan.draft_chained) and bool(plan.draft_chained[i]))
    gone = [r for r in c.req_ids if r in drop] if forget else []
    return replace(
        plan, new_requests=new_requests, cached_requests=cached,
        finished_req_ids=[*plan.finished_req_ids, *gone],
        # no drafts left: a step without drafts, as the scheduler would have sent it
        num_draft_tokens=counts if any(counts) else [], draft_token_ids=draft_ids,
        draft_chained=chained if any(chained) else [])
