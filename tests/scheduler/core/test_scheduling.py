"""Scheduling decisions, driven with hand-made sampled tokens (vLLM core-test style)."""

import dataclasses

import pytest

from tests.scheduler.sched_driver import cached_rows, make_scheduler, req
from scheduler_svc.core.request import FinishReason, RequestStatus
from step_protocol.domain import CachedRequestData


def rows(plan):
    """(req_id, num_scheduled_tokens, block ids sent) per row, new requests first."""
    return ([(r.req_id, r.num_scheduled_tokens, r.block_ids) for r in plan.new_requests]
            + cached_rows(plan.cached_requests))


def test_prefill_then_decode_with_block_deltas():
    s = make_scheduler(block_size=4)
    s.add_request(req(0, [1, 2, 3, 4, 5]))
    s.add_request(req(1, [6, 7, 8]))
    plan = s.schedule()
    assert rows(plan) == [(0, 5, [1, 2]), (1, 3, [3])]
    assert [r.token_ids for r in plan.new_requests] == [[1, 2, 3, 4, 5], [6, 7, 8]]
    assert [r.num_computed_tokens for r in plan.new_requests] == [0, 0]
    outs = s.update_from_output(plan, {0: 10, 1: 11})
    assert [(o.req_id, o.new_token_ids, o.new_text) for o in outs] == [
        (0, [10], "k"), (1, [11], "l")]
    assert [o.num_prompt_tokens for o in outs] == [5, 3]

    plan = s.schedule()  # decode: one token each, slot 5 of req 0 and slot 3 of req 1
    assert not plan.new_requests and rows(plan) == [(0, 1, []), (1, 1, [])]
    s.update_from_output(plan, {0: 12, 1: 13})
    plan = s.schedule()  # req 1 now needs slot 4: exactly one new block
    assert rows(plan) == [(0, 1, []), (1, 1, [4])]
    assert s.requests[1].block_ids == [3, 4]
    assert s.num_free_blocks == s.num_total_blocks - 4


def test_decode_rows_carry_no_token_ids():
    fields = {f.name for f in dataclasses.fields(CachedRequestData)}
    assert fields == {"req_ids", "num_scheduled_tokens", "num_new_blocks", "new_block_ids"}


def test_budget_goes_to_running_first_then_waiting_chunked():
    s = make_scheduler(max_num_batched_tokens=10, block_size=4)
    s.add_request(req(0, [1] * 4))
    s.add_request(req(1, [2] * 4))
    plan = s.schedule()
    assert rows(plan) == [(0, 4, [1]), (1, 4, [2])]
    s.update_from_output(plan, {0: 3, 1: 3})
    s.add_request(req(2, [5] * 12))
    plan = s.schedule()  # 2 decodes (each into a new block), then 8 of the 12 prompt tokens
    assert rows(plan) == [(2, 8, [5, 6]), (0, 1, [3]), (1, 1, [4])]
    outs = s.update_from_output(plan, {0: 4, 1: 4})  # the partial chunk samples nothing
    assert [o.req_id for o in outs] == [0, 1]
    plan = s.schedule()  # running in arrival order; the prefill's rest is a cached row
    assert rows(plan) == [(0, 1, []), (1, 1, []), (2, 4, [7])]
    s.update_from_output(plan, {0: 4, 1: 4, 2: 9})
    assert s.requests[2].output_token_ids == [9]


@pytest.mark.parametrize("budget,threshold,chunks", [
    (8, 0, [8, 8, 4]),  # cut by the step budget
    (100, 6, [6, 6, 6, 2]),  # cut by long_prefill_token_threshold
])
def test_long_prompt_is_chunked_across_steps(budget, threshold, chunks):
    s = make_scheduler(max_num_batched_tokens=budget, long_prefill_token_threshold=threshold)
    s.add_request(req(0, list(range(20)), max_tokens=2))
    scheduled = []
    for i, chunk in enumerate(chunks):
        plan = s.schedule()
        scheduled.append(plan.num_scheduled_tokens)
        assert (len(plan.new_requests), len(plan.cached_requests)) == ((1, 0) if i == 0 else (0, 1))
        last = i == len(chunks) - 1
        outs = s.update_from_output(plan, {0: 7} if last else {})
        assert [o.new_token_ids for o in outs] == ([[7]] if last else [])
        assert s.requests[0].num_computed_tokens == sum(chunks[:i + 1])
    assert scheduled == chunks
    plan = s.schedule()
    assert [(r[0], r[1]) for r in cached_rows(plan.cached_requests)] == [(0, 1)]
    outs = s.update_from_output(plan, {0: 8})
    assert outs[0].finish_reason == FinishReason.LENGTH and outs[0].num_output_tokens == 2


def test_max_num_seqs_limits_running():
    s = make_scheduler(max_num_seqs=2)
    for i in range(3):
        s.add_request(req(i, [1, 2], max_tokens=1 if i == 0 else 5))
    plan = s.schedule()
    assert [r.req_id for r in plan.new_requests] == [0, 1]
    assert (s.num_running, s.num_waiting) == (2, 1)
    outs = s.update_from_output(plan, {0: 5, 1: 5})
    assert outs[0].finish_reason == FinishReason.LENGTH
    plan = s.schedule()  # req 0 left: req 2 joins in the same step
    assert plan.finished_req_ids == [0]
    assert rows(plan) == [(2, 2, [3]), (1, 1, [])]  # block 1 went to the back of the free list
    s.update_from_output(plan, {1: 5, 2: 5})
    assert s.schedule().finished_req_ids == []  # reported once


def test_abort_running_frees_exactly_its_blocks():
    s = make_scheduler(block_size=4)
    s.add_request(req(0, [1] * 9))  # 3 blocks
    s.add_request(req(1, [1] * 3))  # 1 block
    s.update_from_output(s.schedule(), {0: 2, 1: 2})
    free_before = s.num_free_blocks
    s.abort_request(0)
    assert s.num_free_blocks == free_before + 3
    assert s.requests.keys() == {1}
    plan = s.schedule()
    assert plan.finished_req_ids == [0] and rows(plan) == [(1, 1, [])]


def test_abort_with_step_in_flight_frees_after_that_step():
    s = make_scheduler(block_size=4)
    s.add_request(req(0, [1] * 9))
    s.add_request(req(1, [1] * 3))
    plan = s.schedule()
    free_before = s.num_free_blocks
    s.abort_request(0)  # step `plan` may still write its blocks
    assert s.num_free_blocks == free_before
    assert s.requests[0].status == RequestStatus.FINISHED
    outs = s.update_from_output(plan, {0: 2, 1: 2})
    assert [o.req_id for o in outs] == [1]  # no output for the aborted request
    assert s.num_free_blocks == free_before + 3
    assert s.schedule().finished_req_ids == [0]


def test_abort_waiting_request_is_not_reported_to_executor():
    s = make_scheduler(max_num_seqs=1)
    s.add_request(req(0, [1, 2]))
    s.add_request(req(1, [1, 2]))
    s.update_from_output(s.schedule(), {0: 3})
    s.abort_request(1)
    s.abort_request(1)  # twice is harmless
    s.abort_request(99)  # unknown too
    plan = s.schedule()
    assert plan.finished_req_ids == [] and s.num_waiting == 0 and 1 not in s.requests


def test_update_must_follow_step_order():
    s = make_scheduler()
    s.add_request(req(0, [1, 2]))
    first, second = s.schedule(), s.schedule()
    with pytest.raises(RuntimeError):
        s.update_from_output(second, {})
    s.update_from_output(first, {0: 3})
    s.update_from_output(second, {0: 4})


def test_rejects_requests_that_can_never_run():
    s = make_scheduler(num_blocks=3, block_size=4, max_model_len=32)  # 8 slots
    with pytest.raises(ValueError):
        s.add_request(req(0, []))
    with pytest.raises(ValueError):
        s.add_request(req(1, [1] * 32))  # no room to generate
    with pytest.raises(ValueError):
        s.add_request(req(2, [1] * 6, max_tokens=4))  # needs 9 slots
    s.add_request(req(3, [1] * 6, max_tokens=3))  # 8 slots: the last token is never fed back
    with pytest.raises(ValueError):
        s.add_request(req(3, [1]))  # duplicate id


def test_a_result_missing_a_due_token_is_an_error_but_a_partial_chunk_needs_none():
    from scheduler_svc.core.scheduler import StepResultError

    s = make_scheduler(block_size=4, max_num_batched_tokens=6, long_prefill_token_threshold=0)
    s.add_request(req(0, list(range(1, 10))))  # 9 tokens: a 6-token chunk, then 3 more
    first = s.schedule()
    assert rows(first) == [(0, 6, [1, 2])]
    assert s.update_from_output(first, {}) == []  # partial chunk: no token due
    second = s.schedule()
    assert rows(second) == [(0, 3, [3])]
    with pytest.raises(StepResultError, match="no token for requests \\[0\\]"):
        s.update_from_output(second, {})
