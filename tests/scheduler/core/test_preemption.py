"""Preemption by recompute when the block pool runs dry."""

from tests.scheduler.sched_driver import Stream, cached_rows, collect, make_scheduler, req, run
from scheduler_svc.core.request import FinishReason, RequestStatus


def rows(plan):
    return ([("new", r.req_id, r.num_scheduled_tokens, len(r.block_ids)) for r in plan.new_requests]
            + [("cached", req_id, n, len(blocks))
               for req_id, n, blocks in cached_rows(plan.cached_requests)])


def tiny_scheduler(**overrides):
    # 4 usable blocks of 2 slots: two 3-token prompts fill them.
    return make_scheduler(num_blocks=5, block_size=2, **overrides)


def test_newest_running_request_is_preempted_and_resumed_in_full():
    # Without prefix caching (test_prefix_cache.py has the resume from a cached prefix).
    s = tiny_scheduler(enable_prefix_caching=False)
    s.add_request(req(0, [1, 2, 3], max_tokens=4))
    s.add_request(req(1, [4, 5, 6], max_tokens=4))
    streams: dict[int, Stream] = {}
    plan = s.schedule()
    assert rows(plan) == [("new", 0, 3, 2), ("new", 1, 3, 2)] and s.num_free_blocks == 0
    collect(streams, s.update_from_output(plan, {0: 10, 1: 20}))
    plan = s.schedule()  # slot 3 of each still fits
    collect(streams, s.update_from_output(plan, {0: 11, 1: 21}))

    plan = s.schedule()  # request 0 needs a third block: request 1 (newest) makes room
    assert plan.preempted_req_ids == [1]
    assert rows(plan) == [("cached", 0, 1, 1)]
    assert s.requests[1].status == RequestStatus.PREEMPTED and s.requests[1].block_ids == []
    assert list(s.waiting) == [s.requests[1]] and s.num_free_blocks == 1
    collect(streams, s.update_from_output(plan, {0: 12}))

    plan = s.schedule()  # request 1 needs 3 blocks for 5 tokens; 1 is free
    assert rows(plan) == [("cached", 0, 1, 0)]
    collect(streams, s.update_from_output(plan, {0: 13}))
    assert streams[0].finish_reason == FinishReason.LENGTH and s.num_free_blocks == 4

    plan = s.schedule()  # resumed: prompt + generated tokens, computed from scratch
    assert plan.finished_req_ids == [0]
    (new,) = plan.new_requests
    assert (new.req_id, new.token_ids, new.num_computed_tokens, new.num_scheduled_tokens) == (
        1, [4, 5, 6, 20, 21], 0, 5)
    assert len(new.block_ids) == 3
    outs = s.update_from_output(plan, {1: 22})
    assert [(o.new_token_ids, o.num_output_tokens) for o in outs] == [([22], 3)]  # no re-stream
    collect(streams, outs)
    collect(streams, s.update_from_output(s.schedule(), {1: 23}))
    assert streams[1].token_ids == [20, 21, 22, 23]
    assert streams[1].finish_reason == FinishReason.LENGTH
    assert s.num_free_blocks == s.num_total_blocks
    assert s.schedule().finished_req_ids == [1] and not s.has_work()


def test_one_step_ahead_preemption_waits_for_the_step_in_flight():
    s = tiny_scheduler()
    s.add_request(req(0, [1, 2, 3], max_tokens=4))
    s.add_request(req(1, [4, 5, 6], max_tokens=4))
    p0 = s.schedule()
    p1 = s.schedule()  # decode of both planned before step 0's tokens are known
    assert rows(p1) == [("cached", 0, 1, 0), ("cached", 1, 1, 0)]
    s.update_from_output(p0, {0: 10, 1: 20})

    p2 = s.schedule()  # request 0 needs a block; request 1's come back only after p1
    assert p2.preempted_req_ids == [1] and rows(p2) == []
    assert s.num_free_blocks == 0 and len(s.requests[1].block_ids) == 2
    outs = s.update_from_output(p1, {0: 11, 1: 21})  # request 1's token still counts
    assert [(o.req_id, o.new_token_ids) for o in outs] == [(0, [11]), (1, [21])]
    assert s.num_free_blocks == 2
    assert s.update_from_output(p2, {}) == []  # a plan without rows: nothing to apply

    p3 = s.schedule()
    assert rows(p3) == [("cached", 0, 1, 1)]  # request 1 needs 3 blocks: it waits
    p4 = s.schedule()
    assert rows(p4) == [("cached", 0, 1, 0)]
    s.update_from_output(p3, {0: 12})
    s.update_from_output(p4, {0: 13})  # request 0 done (max_tokens)
    p5 = s.schedule()
    assert p5.finished_req_ids == [0]
    assert [(r.req_id, r.token_ids) for r in p5.new_requests] == [(1, [4, 5, 6, 20, 21])]


def test_a_lone_request_that_outgrows_the_pool_cannot_be_admitted():
    s = tiny_scheduler()
    s.add_request(req(0, [1, 2, 3], max_tokens=6))  # 8 slots: exactly the pool
    streams, _ = run(s, {0: []}, ahead=False)
    assert streams[0].num_outputs == 6


def test_preemption_is_invisible_in_outputs():
    def scenario():
        return {0: [req(i, [i + 1] * (3 + i), max_tokens=12) for i in range(4)]}

    reference, _ = run(make_scheduler(), scenario(), ahead=False)
    for ahead in (False, True, 3, 4):
        streams, plans = run(tiny_scheduler_for(5), scenario(), ahead=ahead)
        assert sum(len(p.preempted_req_ids) for p in plans) > 0
        assert streams == reference


def tiny_scheduler_for(num_usable_blocks):
    return make_scheduler(num_blocks=num_usable_blocks + 1, block_size=4)
