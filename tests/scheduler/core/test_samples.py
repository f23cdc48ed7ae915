"""Parallel sampling (n > 1): the samples of one request, seeded seed + i, and samples 1..n-1
held until sample 0's prompt KV is written, so that they hit every full prompt block (exact
hit counts), correct under chunked prefill, one step ahead, preemption and abort."""

import pytest

from scheduler_svc.core.request import RequestStatus, SamplingParams
from scheduler_svc.core.samples import sample_requests
from tests.scheduler.sched_driver import make_scheduler, reference_tokens, req, run

PROMPT = list(range(1, 15))  # 14 tokens: 3 full blocks of 4 before the last token


def samples(n=3, req_id=10, prompt=PROMPT, **params):
    params = {"max_tokens": 6, "ignore_eos": True, "seed": 5, **params}
    return sample_requests(req_id, prompt, SamplingParams(n=n, **params))


def test_sample_requests_ids_seeds_and_prompt_logprobs():
    rs = samples(4, seed=2**64 - 2, prompt_logprobs=1, logprobs=0)
    assert [r.req_id for r in rs] == [10, 11, 12, 13]
    assert [r.params.seed for r in rs] == [2**64 - 2, 2**64 - 1, 0, 1]  # uint64, wrapping
    assert [r.params.prompt_logprobs for r in rs] == [1, None, None, None]  # the prompt is shared
    assert [r.params.logprobs for r in rs] == [0] * 4 and {r.params.n for r in rs} == {1}
    assert [r.leader for r in rs] == [None] + [rs[0]] * 3
    (one,) = sample_requests(3, PROMPT, SamplingParams(max_tokens=2, seed=9))
    assert (one.req_id, one.params.seed, one.leader) == (3, 9, None)


@pytest.mark.parametrize("ahead", [False, True, 3])
def test_samples_hit_every_full_block_of_the_leader_s_prompt(ahead):
    s = make_scheduler(num_blocks=40, block_size=4)
    streams, plans = run(s, {0: samples(3)}, ahead=ahead, seeded=True)
    new = {r.req_id: r for p in plans for r in p.new_requests}
    depth = ahead if ahead > 1 else ahead + 1  # False, True -> 1, 2
    # admitted by the first plan made after sample 10's prompt step was applied
    assert [p.step_id for p in plans if 11 in [r.req_id for r in p.new_requests]] == [depth]
    assert (new[10].num_computed_tokens, new[11].num_computed_tokens, new[12].num_computed_tokens) == (0, 12, 12)
    assert new[11].block_ids[:3] == new[12].block_ids[:3] == new[10].block_ids[:3]
    assert s.take_prefix_cache_stats() == (3 * 14, 2 * 12)  # exact: 3 blocks for each later sample
    assert [new[i].sampler_params.seed for i in (10, 11, 12)] == [5, 6, 7]
    assert len({tuple(streams[i].token_ids) for i in (10, 11, 12)}) == 3  # different seeds, samples


def test_seeded_samples_are_reproducible_and_match_single_requests_of_those_seeds():
    first, _ = run(make_scheduler(), {0: samples(4, seed=77)}, ahead=True, seeded=True)
    again, _ = run(make_scheduler(), {0: samples(4, seed=77)}, ahead=False, seeded=True)
    singles, _ = run(make_scheduler(), {0: [req(i, PROMPT, 6, ignore_eos=True, seed=77 + i) for i in range(4)]},
                     ahead=True, seeded=True)
    assert [first[10 + i].token_ids for i in range(4)] == [again[10 + i].token_ids for i in range(4)]
    assert [first[10 + i].token_ids for i in range(4)] == [singles[i].token_ids for i in range(4)]
    other, _ = run(make_scheduler(), {0: samples(4, seed=78)}, ahead=True, seeded=True)
    assert other[10].token_ids == first[11].token_ids  # seed 78 is sample 1 of seed 77


def test_samples_wait_out_a_chunked_prefill_of_the_leader():
    s = make_scheduler(num_blocks=40, block_size=4, long_prefill_token_threshold=5)
    for r in samples(3):
        s.add_request(r)
    assert (s.num_waiting, len(s.waiting)) == (3, 1)  # two held: they count as waiting
    plans = []
    for sampled in ({}, {}, {10: 3}):  # the leader's 14 tokens in chunks of 5, 5, 4
        plans.append(s.schedule())
        assert [r.req_id for r in plans[-1].new_requests] in ([10], [])
        s.update_from_output(plans[-1], sampled)
    assert len(s.waiting) == 2  # its prompt is written: released
    plan = s.schedule()
    assert [(r.req_id, r.num_computed_tokens) for r in plan.new_requests] == [(11, 12), (12, 12)]


def test_a_fully_cached_leader_releases_its_samples_in_the_same_step():
    s = make_scheduler(num_blocks=40, block_size=4)
    s.add_request(req(0, PROMPT, 1))
    s.update_from_output(s.schedule(), {0: 3})
    s.take_prefix_cache_stats()
    for r in samples(3):
        s.add_request(r)
    plan = s.schedule()
    assert [(r.req_id, r.num_computed_tokens) for r in plan.new_requests] == [(10, 12), (11, 12), (12, 12)]
    assert s.take_prefix_cache_stats() == (42, 36)


def test_without_prefix_caching_nothing_is_held():
    s = make_scheduler(enable_prefix_caching=False)
    for r in samples(3):
        s.add_request(r)
    plan = s.schedule()
    assert [(r.req_id, r.num_computed_tokens) for r in plan.new_requests] == [(10, 0), (11, 0), (12, 0)]
    short = make_scheduler()
    for r in samples(2, req_id=20, prompt=[1, 2, 3, 4]):  # no full block before the last token
        short.add_request(r)
    assert [r.req_id for r in short.schedule().new_requests] == [20, 21]


@pytest.mark.parametrize("ahead", [False, True, 3])
def test_aborting_every_sample_frees_everything(ahead):
    # aborted while the leader's prompt is in flight (samples still held), and later
    for abort_at in (1, 3, 6):
        s = make_scheduler(num_blocks=40, block_size=4)
        streams, _ = run(s, {0: samples(3, max_tokens=20)}, {abort_at: [10, 11, 12]}, ahead=ahead)
        # run() checks: no request left, every block free, every ref count 0
        assert all(len(stream.token_ids) < 20 for stream in streams.values())
        assert s.held.num_held == 0 and not s.waiting and not s.running


def test_aborting_the_leader_releases_its_samples_and_a_held_sample_can_be_aborted():
    s = make_scheduler(num_blocks=40, block_size=4)
    rs = samples(3)
    for r in rs:
        s.add_request(r)
    plan = s.schedule()  # the leader's prompt in flight
    s.abort_request(12)  # a held sample
    assert s.held.num_held == 1 and 12 not in s.requests
    s.abort_request(10)  # the leader: its sample computes on its own
    assert s.held.num_held == 0 and list(s.waiting) == [rs[1]]
    s.update_from_output(plan, {10: 3})  # discarded: an aborted request caches nothing of it
    (new,) = s.schedule().new_requests
    assert (new.req_id, new.num_computed_tokens) == (11, 0)
    assert s.num_free_blocks == s.num_total_blocks - 4 and s.held.num_held == 0


def test_a_preempted_leader_releases_its_samples():
    s = make_scheduler(num_blocks=40, block_size=4)
    s.add_request(req(0, [5, 6, 7], 30, ignore_eos=True))  # older: it preempts the leader
    rs = samples(2)
    for r in rs:
        s.add_request(r)
    plan = s.schedule()
    s._preempt(rs[0], plan)  # as _make_room would when the pool runs dry
    assert rs[0].status is RequestStatus.PREEMPTED and s.held.num_held == 0
    assert list(s.waiting) == [rs[0], rs[1]]


@pytest.mark.parametrize("ahead", [False, True, 3])
def test_samples_under_preemption_stream_what_single_requests_would(ahead):
    # a pool too small for all at once: samples and a long request preempt each other
    prompt = list(range(1, 10))
    s = make_scheduler(num_blocks=13, block_size=4)
    streams, plans = run(s, {0: samples(3, prompt=prompt, max_tokens=20),
                             2: [req(0, [5, 6, 7], 30, ignore_eos=True)]}, ahead=ahead)
    assert any(p.preempted_req_ids for p in plans)
    for i in range(3):
        assert streams[10 + i].token_ids == reference_tokens(prompt, 20)  # the fake ignores seeds
    assert streams[0].token_ids == reference_tokens([5, 6, 7], 30)
