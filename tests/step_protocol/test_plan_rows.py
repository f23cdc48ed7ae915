"""A plan less some rows (plan_rows.without_rows) keeps its columns consistent, and a new
request that does not encode fails alone (codec.plan_to_pb_dropping)."""

import pytest

from step_protocol import codec
from step_protocol.domain import CachedRequestData, NewRequestData, SamplerParams, StepPlan, StepResult
from step_protocol.plan_rows import without_rows


def _plan() -> StepPlan:
    plan = StepPlan(7, [NewRequestData(1, [5, 6], SamplerParams(), [1], 0, 2),
                        NewRequestData(2, [5, 6], SamplerParams(top_k=1 << 40), [2], 0, 2)],
                    finished_req_ids=[9])
    plan.cached_requests.append(10, 3, [3])
    plan.add_drafts([11, 12], chained=True)
    plan.cached_requests.append(20, 1, [])
    plan.cached_requests.append(30, 2, [4, 5])
    plan.add_drafts([31])
    return plan


def test_without_cached_rows_cuts_every_column_and_forgets_them():
    plan = _plan()
    out = without_rows(plan, [10, 2], forget=True)
    assert [r.req_id for r in out.new_requests] == [1]
    assert out.cached_requests == CachedRequestData([20, 30], [1, 2], [0, 2], [4, 5])
    assert (out.num_draft_tokens, out.draft_token_ids, out.draft_chained) == ([0, 1], [31], [])
    assert out.finished_req_ids == [9, 10]
    assert plan.cached_requests.req_ids == [10, 20, 30] and plan.finished_req_ids == [9]  # unchanged
    no_drafts = without_rows(plan, [10, 30])
    assert (no_drafts.num_draft_tokens, no_drafts.draft_token_ids, no_drafts.finished_req_ids) == ([], [], [9])


def test_without_new_requests_only_leaves_the_cached_columns_as_sent():
    plan = _plan()
    out = without_rows(plan, [1])
    assert [r.req_id for r in out.new_requests] == [2]
    assert out.cached_requests is plan.cached_requests and out.num_draft_tokens == [2, 0, 1]


def test_a_new_request_that_does_not_encode_is_left_out_alone():
    plan = _plan()
    with pytest.raises(ValueError):
        codec.plan_to_pb(plan)
    msg, failed = codec.plan_to_pb_dropping(plan)
    assert [r.req_id for r in msg.new_requests] == [1] and list(msg.cached_requests.req_ids) == [10, 20, 30]
    assert [r for r, _ in failed] == [2] and "new request 2 does not encode: ValueError" in failed[0][1]
    good = without_rows(plan, [2])
    assert codec.plan_to_pb_dropping(good) == (codec.plan_to_pb(good), [])


def test_failed_rows_cross_the_wire():
    result = StepResult(3, [1], [42], failed_req_ids=[2, 5], failed_errors=["new request 2: x", "y"])
    back = codec.result_from_pb(codec.result_to_pb(result))
    assert (back.failed_req_ids, back.failed_errors) == ([2, 5], ["new request 2: x", "y"])
