"""Chained verify rows (core/spec/rows.py): a speculating request's next verify row planned
while its previous one is in flight, assuming every draft accepted; void (no token, its slots
given back) when a row before it rejected one. Against the speculating fake executor, which
runs a chained row only when the request's previous verify row accepted every draft."""

from __future__ import annotations

import pytest

from scheduler_svc.core.logprobs import StepResultError
from tests.scheduler.core.spec.test_decoder import SPEC, SpecFakeExecutor, drive, same, scenario
from tests.scheduler.sched_driver import make_scheduler, req


def started(prompt, **params):
    """A scheduler with one request whose prompt step is applied, and the fake executor."""
    s = make_scheduler(speculative=SPEC, num_blocks=32, block_size=4)
    executor = SpecFakeExecutor(4)
    s.add_request(req(0, prompt, **params))
    plan = s.schedule()
    s.update_from_output(plan, executor.execute(plan).sampled())
    executor.applied(plan.step_id)
    return s, executor, s.requests[0]


def apply(s, executor, plan):
    result = executor.execute(plan)
    executor.applied(plan.step_id)
    return result, s.update_from_output(plan, result.sampled(), result)


def test_a_chained_row_follows_the_drafts_in_flight_and_is_void_after_a_rejection():
    s, executor, request = started([1, 2, 3] * 4, max_tokens=30, ignore_eos=True)
    assert request.all_token_ids == [1, 2, 3] * 4 + [1] and request.num_computed_tokens == 12
    total = s.num_total_blocks
    p1 = s.schedule()  # [1] + drafts 2 3 1 at positions 12..15
    assert p1.draft_token_ids == [2, 3, 1] and p1.draft_chained == []
    assert p1.cached_requests.num_scheduled_tokens == [4] and request.num_computed_tokens == 16
    p2 = s.schedule()  # chained: assumes 2 3 1, then the match's next token (2) as p1's last
    assert p2.draft_chained == [True] and p2.draft_token_ids == [3, 1, 2, 3]
    assert p2.cached_requests.num_scheduled_tokens == [5] and request.num_computed_tokens == 21
    assert p2.cached_requests.new_block_ids == [5, 6]  # positions 16..20: blocks 4 and 5 of it
    assert [r.guess for r in request.spec_rows] == [2, None]
    p3 = s.schedule()  # chained on both: 2 3 1 | 2 | 3 1 2 3 | 1 | ...
    assert p3.draft_chained == [True] and p3.draft_token_ids == [2, 3, 1, 2]
    assert request.num_computed_tokens == 26 and request.num_pending_tokens == 3
    assert s.num_free_blocks == total - 7

    # the model rejects draft 3 at position 14: p2 and p3 are void, their slots given back now
    r1, outs = apply(s, executor, p1)
    assert r1.sampled() == {0: [2, 1]} and outs[0].new_token_ids == [2, 1]
    assert request.num_computed_tokens == request.num_tokens - 1 == 14
    assert [r.void for r in request.spec_rows] == [True, True]
    assert not s.schedule().has_rows()  # it waits for its void rows: nothing to plan
    r2, outs = apply(s, executor, p2)
    assert r2.sampled() == {0: []} and outs == []
    r3, outs = apply(s, executor, p3)
    assert r3.sampled() == {0: []} and outs == []
    assert request.num_pending_tokens == request.num_inflight_steps == 0 and not request.spec_rows
    assert request.num_written_tokens == 14  # the prompt and p1's [1, 2]: nothing of p2, p3
    assert executor.num_void_rows == 2 and s.take_spec_decode_stats() == (1, 3, 1)
    p4 = s.schedule()  # an unchained verify row from the true length
    assert p4.draft_chained == [] and request.num_computed_tokens == 15 + len(p4.draft_token_ids)


def test_a_valid_chain_yields_every_row_and_cancelling_it_frees_every_block(monkeypatch):
    from tests.scheduler.core.spec import test_decoder

    monkeypatch.setattr(test_decoder, "model", lambda tokens: tokens[-3])  # accepts every draft
    s, executor, request = started([1, 2, 3] * 4, max_tokens=40, ignore_eos=True)
    p1, p2, p3 = s.schedule(), s.schedule(), s.schedule()
    assert [p.draft_chained for p in (p1, p2, p3)] == [[], [True], [True]]
    _, outs = apply(s, executor, p1)
    assert outs[0].new_token_ids == [2, 3, 1, 2]  # 3 drafts and the bonus, as p2 guessed
    _, outs = apply(s, executor, p2)
    assert outs[0].new_token_ids == [3, 1, 2, 3, 1]  # p2's first token was p1's bonus (2)
    assert request.num_computed_tokens == request.num_tokens - 1 + 5  # p3 (1 + 4) in flight
    assert request.num_written_tokens == request.num_tokens - 1 == 21
    assert executor.num_void_rows == 0 and s.take_spec_decode_stats() == (2, 7, 7)
    s.abort_request(0)  # mid-chain: its blocks stay held until p3 is applied
    assert s.num_total_blocks - s.num_free_blocks == 7  # 26 slots of 4
    apply(s, executor, p3)
    assert s.num_free_blocks == s.num_total_blocks and not s.requests


def test_chains_stop_at_max_tokens():
    # max_tokens 9: p1 yields at most 4 (1 + 3 drafts) after the prompt's token, so a chained
    # row may ask for at most 9 - 1 - 4 - 1 = 3 drafts, and none may follow it
    s, executor, request = started([1, 2, 3] * 4, max_tokens=9, ignore_eos=True)
    p1, p2, p3 = s.schedule(), s.schedule(), s.schedule()
    assert len(p1.draft_token_ids) == 3 and p2.draft_chained == [True] and len(p2.draft_token_ids) == 3
    assert not p3.has_rows()


@pytest.mark.parametrize("budget", [32, 7])
def test_outputs_equal_with_chains_and_void_rows(budget):
    reference, _, _ = drive(None, scenario(), max_model_len=32, max_num_batched_tokens=budget)
    executors = []

    class Counting(SpecFakeExecutor):
        def __init__(self, block_size):
            super().__init__(block_size)
            executors.append(self)

    streams, plans, s = drive(SPEC, scenario(), depth=3, max_model_len=32, max_num_batched_tokens=budget,
                              executor_class=Counting)
    assert same(streams, reference)
    assert executors[0].num_chained_rows > executors[0].num_void_rows > 0
    assert s.num_free_blocks == s.num_total_blocks and not s.requests


def test_tokens_for_a_void_row_are_refused():
    s, executor, request = started([1, 2, 3] * 4, max_tokens=30, ignore_eos=True)
    p1, p2 = s.schedule(), s.schedule()
    apply(s, executor, p1)  # rejects: p2 is void
    with pytest.raises(StepResultError, match="void chained verify row"):
        s.update_from_output(p2, {0: [3, 1]})


@pytest.mark.parametrize("num_blocks", [10, 12, 16])
def test_preemption_mid_chain_keeps_outputs_and_blocks_exact(num_blocks):
    """A pool so small that requests are preempted, some while chained rows of theirs are in
    flight: their valid rows' tokens are kept, void rows answer nothing, they recompute later,
    and every output and block count is as without speculation."""
    config = dict(max_model_len=32, num_blocks=num_blocks, block_size=4)
    reference, _, _ = drive(None, scenario(), **config)
    streams, plans, s = drive(SPEC, scenario(), depth=3, **config)
    assert same(streams, reference)
    chained_in_flight = 0
    for i, plan in enumerate(plans):  # at depth 3 the two plans before this one may be in flight
        recent = {r for p in plans[max(0, i - 2):i] for r, c in zip(p.cached_requests.req_ids, p.draft_chained) if c}
        chained_in_flight += len(recent & set(plan.preempted_req_ids))
    assert chained_in_flight > 0
    assert s.num_free_blocks == s.num_total_blocks and not s.requests


def test_no_chain_past_disable_by_batch_size():
    """disable_by_batch_size holds for chains too: once more requests run, a request with
    verify rows in flight chains no more (it waits for them, then decodes plainly)."""
    from dataclasses import replace

    s = make_scheduler(speculative=replace(SPEC, disable_by_batch_size=1), num_blocks=64, block_size=4)
    executor = SpecFakeExecutor(4)
    s.add_request(req(0, [1, 2, 3] * 4, max_tokens=30, ignore_eos=True))
    plan = s.schedule()
    apply(s, executor, plan)
    p1, p2 = s.schedule(), s.schedule()
    assert p1.num_draft_tokens == [3] and p2.draft_chained == [True]  # alone: it chains
    s.add_request(req(1, [7, 8, 9] * 3, max_tokens=30, ignore_eos=True))
    p3 = s.schedule()  # request 1 admitted (request 0 planned first, with 1 running: chains)
    assert [n.req_id for n in p3.new_requests] == [1] and p3.draft_chained == [True]
    p4 = s.schedule()  # 2 running > 1: request 0 waits for its rows instead of chaining
    assert p4.cached_requests.req_ids == [1] and not p4.num_draft_tokens
    for plan in (p1, p2, p3, p4):
        apply(s, executor, plan)
    later = [s.schedule() for _ in range(3)]
    assert all(not p.num_draft_tokens and not p.draft_chained for p in later)
    assert all(p.cached_requests.req_ids == [0, 1] for p in later)  # plain pipelined decodes
