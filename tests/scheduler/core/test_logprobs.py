"""Logprobs from the executor's StepResult to the requests' outputs: aligned with the tokens,
top-N cut per request, prompt logprobs delivered once (also across preemption), and requests
asking for prompt logprobs computing their prompt (no prefix hit) while still caching it.
The FakeExecutor (sched_driver.py) answers logprobs as the executor's columns."""

import pytest

from scheduler_svc.core.logprobs import StepResultError
from step_protocol.domain import StepResult
from tests.scheduler.sched_driver import fake_logprob_row, make_scheduler, reference_tokens, req, run

PROMPT = [3, 1, 4, 1, 5, 9, 2]


def expected_logprobs(prompt, tokens, k):
    """What a stream must carry for its tokens: the fake model's rows, cut to k."""
    out = []
    for i, t in enumerate(tokens):
        lp, rank, top_ids, top_lps = fake_logprob_row(len(prompt) + i, t, k)
        out.append((t, lp, rank, top_ids, top_lps))
    return out


def expected_prompt_logprobs(prompt, k):
    return [(prompt[0], None, 0, [], [])] + [
        (t, *fake_logprob_row(p, t, k)) for p, t in enumerate(prompt) if p > 0]


def prompt_entries(stream):
    """A stream's prompt logprobs as entries, the floats as float32 (they cross as arrays)."""
    return [(t, lp if lp is None else pytest.approx(lp, rel=1e-6), r, ids, pytest.approx(lps, rel=1e-6))
            for t, lp, r, ids, lps in stream.prompt_logprobs.entries()]


@pytest.mark.parametrize("ahead", [False, True, 3])
def test_logprobs_travel_with_their_tokens_cut_to_each_request_s_top_n(ahead):
    s = make_scheduler(max_num_batched_tokens=8, long_prefill_token_threshold=3)  # chunked prefills
    requests = [req(0, PROMPT, 9, ignore_eos=True, logprobs=2),
                req(1, PROMPT[:4], 7, ignore_eos=True, logprobs=5),  # the step's largest k
                req(2, PROMPT[:5], 6, ignore_eos=True, logprobs=0),  # the sampled token's only
                req(3, PROMPT[:6], 8, ignore_eos=True)]  # asked for nothing
    streams, plans = run(s, {0: requests[:2], 2: requests[2:]}, ahead=ahead)
    for r, k in zip(requests[:3], (2, 5, 0)):
        tokens = reference_tokens(r.prompt_token_ids, r.params.max_tokens)
        assert streams[r.req_id].token_ids == tokens
        assert streams[r.req_id].logprobs == expected_logprobs(r.prompt_token_ids, tokens, k)
    assert streams[3].logprobs is None and all(s.prompt_logprobs is None for s in streams.values())
    assert [r.sampler_params.logprobs for p in plans for r in p.new_requests] == [2, 5, 0, -1]


@pytest.mark.parametrize("ahead", [False, True, 3])
def test_prompt_logprobs_come_once_with_the_first_token_of_a_chunked_prompt(ahead):
    s = make_scheduler(long_prefill_token_threshold=3)
    streams, _ = run(s, {0: [req(0, PROMPT, 4, prompt_logprobs=3), req(1, PROMPT, 3, prompt_logprobs=0)]},
                     ahead=ahead)
    assert prompt_entries(streams[0]) == expected_prompt_logprobs(PROMPT, 3)
    assert prompt_entries(streams[1]) == expected_prompt_logprobs(PROMPT, 0)
    assert streams[0].logprobs is None


@pytest.mark.parametrize("ahead", [False, True, 3])
def test_prompt_logprobs_are_delivered_once_when_preemption_recomputes_the_prompt(ahead):
    # 9 usable blocks: request 1's 28-token prompt (chunks of 4) is preempted mid-prompt again
    # and again by request 0's decode; each time it recomputes the prompt from position 0.
    s = make_scheduler(num_blocks=10, block_size=4, long_prefill_token_threshold=4,
                       enable_prefix_caching=False)
    prompt = list(range(1, 29))
    streams, plans = run(s, {0: [req(0, PROMPT[:6], 24, ignore_eos=True)],
                             1: [req(1, prompt, 8, ignore_eos=True, prompt_logprobs=2, logprobs=1)]},
                         ahead=ahead)
    preempted = [p.step_id for p in plans if 1 in p.preempted_req_ids]
    resent = [r for p in plans for r in p.new_requests if r.req_id == 1]
    assert len(preempted) >= 3 and len(resent) == len(preempted) + 1
    assert all(r.num_prompt_tokens == 28 for r in resent)
    # each time before its first token: the executor sent the early positions again and again
    assert all(r.sampler_params.prompt_logprobs == 2 and len(r.token_ids) == 28 for r in resent)
    assert prompt_entries(streams[1]) == expected_prompt_logprobs(prompt, 2)  # collect(): once
    tokens = reference_tokens(prompt, 8)
    assert streams[1].token_ids == tokens
    assert streams[1].logprobs == expected_logprobs(prompt, tokens, 1)


def test_a_resumed_request_whose_prompt_logprobs_went_out_asks_no_more():
    # 10 usable blocks: request 1 gets its first token, then is preempted (several times).
    s = make_scheduler(num_blocks=11, block_size=4, long_prefill_token_threshold=4,
                       enable_prefix_caching=False)
    prompt = list(range(1, 29))
    streams, plans = run(s, {0: [req(0, PROMPT[:6], 24, ignore_eos=True)],
                             1: [req(1, prompt, 8, ignore_eos=True, prompt_logprobs=2)]}, ahead=True)
    resent = [r for p in plans for r in p.new_requests if r.req_id == 1]
    assert len(resent) > 1
    assert [r.sampler_params.prompt_logprobs for r in resent] == [2] + [-1] * (len(resent) - 1)
    assert [len(r.token_ids) > 28 for r in resent] == [False] + [True] * (len(resent) - 1)
    assert prompt_entries(streams[1]) == expected_prompt_logprobs(prompt, 2)


def test_prompt_logprobs_requests_take_no_prefix_hit_but_fill_the_cache():
    sys_prompt = list(range(1, 13))  # 3 blocks of 4
    s = make_scheduler(num_blocks=17, block_size=4)
    s.add_request(req(0, sys_prompt + [20], 1))
    s.update_from_output(s.schedule(), {0: 5})
    assert s.take_prefix_cache_stats() == (13, 0) and s.kv.pool.num_cached_blocks == 3

    s.add_request(req(1, sys_prompt + [21, 22, 23, 24, 25], 1, prompt_logprobs=1))  # could hit 3
    plan = s.schedule()
    (new,) = plan.new_requests
    assert (new.num_computed_tokens, new.num_scheduled_tokens) == (0, 17)
    assert s.take_prefix_cache_stats() == (0, 0)  # it did not look the cache up
    s.update_from_output(plan, {1: 6})
    assert s.kv.pool.num_cached_blocks == 4  # its 4th block [21, 22, 23, 24] is new in the cache

    s.add_request(req(2, sys_prompt + [21, 22, 23, 24, 26, 27], 1))
    (new,) = s.schedule().new_requests
    assert new.num_computed_tokens == 16  # 3 blocks of request 0, 1 of request 1
    assert s.take_prefix_cache_stats() == (18, 16)


def test_a_step_without_the_logprobs_a_request_asked_for_breaks_the_protocol():
    s = make_scheduler()
    s.add_request(req(0, PROMPT, 2, logprobs=1))
    plan = s.schedule()
    with pytest.raises(StepResultError, match="asked for logprobs"):
        s.update_from_output(plan, {0: 5}, StepResult(plan.step_id, [0], [5]))
