"""Automatic prefix caching: exact block sharing, when blocks become cacheable, LRU eviction,
and outputs identical with caching on and off (the FakeExecutor checks every reused slot)."""

import random

import pytest

from scheduler_svc.core.block_pool import hash_block_tokens
from tests.scheduler.sched_driver import (
    cached_rows,
    make_scheduler,
    reference_tokens,
    req,
    run,
)

SYS = list(range(1, 13))  # a 12-token "system prompt": 3 blocks of 4


def refs(s, block_ids):
    return [s.kv.pool.blocks[b].ref_count for b in block_ids]


def chain(*blocks):
    """The chained hashes of consecutive full blocks of tokens."""
    hashes, parent = [], None
    for tokens in blocks:
        parent = hash_block_tokens(parent, tokens)
        hashes.append(parent)
    return hashes


def test_shared_system_prompt_is_computed_once():
    s = make_scheduler(num_blocks=17, block_size=4)  # 16 usable blocks
    s.add_request(req(0, SYS + [20, 21], max_tokens=3))
    p0 = s.schedule()
    (new0,) = p0.new_requests
    assert (new0.num_computed_tokens, new0.num_scheduled_tokens, new0.block_ids) == (0, 14, [1, 2, 3, 4])
    assert s.kv.pool.num_cached_blocks == 0  # nothing is shared before its KV is written
    s.update_from_output(p0, {0: 5})
    assert s.kv.pool.num_cached_blocks == 3  # the full blocks 1-3; block 4 holds 2 tokens

    s.add_request(req(1, SYS + [22, 23, 24], max_tokens=2))
    p1 = s.schedule()
    (new1,) = p1.new_requests
    assert (new1.num_computed_tokens, new1.num_scheduled_tokens, new1.block_ids) == (12, 3, [1, 2, 3, 5])
    assert refs(s, [1, 2, 3, 4, 5]) == [2, 2, 2, 1, 1] and s.num_free_blocks == 11
    assert s.take_prefix_cache_stats() == (14 + 15, 12) and s.take_prefix_cache_stats() == (0, 0)

    s.update_from_output(p1, {0: 6, 1: 7})
    s.update_from_output(s.schedule(), {0: 8, 1: 9})  # both finish (max_tokens)
    assert not s.running and s.num_free_blocks == s.num_total_blocks == 16
    assert refs(s, range(1, 17)) == [0] * 16
    # Decode tokens filled blocks 4 and 5; a finished request's blocks stay cached.
    assert s.kv.pool.num_cached_blocks == 5
    h = chain(SYS[:4], SYS[4:8], SYS[8:], [20, 21, 5, 6])
    assert [s.kv.pool.cached_block(x) for x in h] == [1, 2, 3, 4]


def test_a_prefix_is_shared_only_once_the_step_writing_it_is_applied():
    s = make_scheduler(num_blocks=17, block_size=4)
    s.add_request(req(0, SYS + [20], max_tokens=4))
    p0 = s.schedule()
    s.add_request(req(1, SYS + [21], max_tokens=4))
    p1 = s.schedule()  # step 0 in flight: request 1 computes the prefix itself
    (new1,) = p1.new_requests
    assert (new1.num_computed_tokens, new1.block_ids) == (0, [5, 6, 7, 8])
    s.update_from_output(p0, {0: 3})
    s.update_from_output(p1, {0: 4, 1: 5})
    h = chain(SYS[:4], SYS[4:8], SYS[8:])
    assert [s.kv.pool.cached_block(x) for x in h] == [1, 2, 3]  # one block per hash: the first
    assert [s.kv.pool.blocks[b].block_hash for b in (5, 6, 7)] == [None] * 3

    s.add_request(req(2, SYS + [22, 23], max_tokens=1))
    (new2,) = s.schedule().new_requests
    assert (new2.num_computed_tokens, new2.block_ids[:3]) == (12, [1, 2, 3])
    assert refs(s, [1, 2, 3, 5, 6, 7]) == [2, 2, 2, 1, 1, 1]


def test_two_requests_in_one_step_both_compute_their_common_prefix():
    s = make_scheduler(num_blocks=17, block_size=4)
    s.add_request(req(0, SYS + [20], max_tokens=2))
    s.add_request(req(1, SYS + [21], max_tokens=2))
    p = s.schedule()
    assert [(r.num_computed_tokens, r.block_ids) for r in p.new_requests] == [
        (0, [1, 2, 3, 4]), (0, [5, 6, 7, 8])]
    assert s.take_prefix_cache_stats() == (26, 0)


@pytest.mark.parametrize("prompt_len, num_hit", [(12, 8), (13, 12), (15, 12), (16, 12)])
def test_at_least_one_token_is_computed_and_a_shared_block_never_written(prompt_len, num_hit):
    prompt = list(range(1, 17))
    s = make_scheduler(num_blocks=17, block_size=4)
    arrivals = {0: [req(0, prompt, max_tokens=1)], 5: [req(1, prompt[:prompt_len], max_tokens=2)]}
    streams, plans = run(s, arrivals, ahead=False)
    (new,) = [r for p in plans for r in p.new_requests if r.req_id == 1]
    assert (new.num_computed_tokens, new.num_scheduled_tokens) == (num_hit, prompt_len - num_hit)
    assert streams[1].token_ids == reference_tokens(prompt[:prompt_len], 2)


@pytest.mark.parametrize("ahead", [False, True, 3])
def test_multi_turn_chat_reuses_the_previous_turn(ahead):
    s = make_scheduler(num_blocks=33, block_size=4)
    turn1 = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    answer = reference_tokens(turn1, 8)
    turn2 = turn1 + answer + [26, 7, 7, 7, 26]  # the client re-sends the chat so far
    arrivals = {0: [req(0, turn1, max_tokens=8, ignore_eos=True)],
                20: [req(1, turn2, max_tokens=6, ignore_eos=True)]}
    streams, plans = run(s, arrivals, ahead=ahead)
    assert streams[0].token_ids == answer
    (new,) = [r for p in plans for r in p.new_requests if r.req_id == 1]
    # 18 tokens of turn 1: the last answer token was never fed back, so 17 have KV: 4 blocks.
    assert new.num_computed_tokens == 16 and new.num_scheduled_tokens == len(turn2) - 16
    assert streams[1].token_ids == reference_tokens(turn2, 6)


def test_a_resumed_request_finds_its_own_blocks():
    s = make_scheduler(num_blocks=7, block_size=2)  # 6 usable blocks of 2
    pool = s.kv.pool
    s.add_request(req(0, [1, 2, 3, 4, 5], max_tokens=4, ignore_eos=True))
    s.add_request(req(1, [6, 7, 8], max_tokens=4, ignore_eos=True))
    p = s.schedule()
    assert [r.block_ids for r in p.new_requests] == [[1, 2, 3], [4, 5]] and s.num_free_blocks == 1
    s.update_from_output(p, {0: 10, 1: 20})  # cached: [1 2] [3 4] of request 0, [6 7] of 1
    s.update_from_output(s.schedule(), {0: 11, 1: 21})  # + [5 10] and [8 20]
    assert pool.num_cached_blocks == 5
    p = s.schedule()  # request 0 takes the last block for slot 6; request 1 has none for slot 4
    assert p.preempted_req_ids == [1] and cached_rows(p.cached_requests) == [(0, 1, [6])]
    assert list(pool.free_block_ids) == [5, 4] and pool.num_cached_blocks == 5  # still cached
    s.update_from_output(p, {0: 12})
    p = s.schedule()  # hitting its 2 cached blocks would leave none for slot 4: it waits
    assert p.new_requests == []
    s.update_from_output(p, {0: 13})  # request 0 finishes: [6, 3, 2, 1] join the queue
    assert list(pool.free_block_ids) == [5, 4, 6, 3, 2, 1]
    (new,) = s.schedule().new_requests
    assert (new.req_id, new.num_computed_tokens, new.num_scheduled_tokens) == (1, 4, 1)
    assert new.token_ids == [6, 7, 8, 20, 21] and new.block_ids == [4, 5, 6]
    assert list(pool.free_block_ids) == [3, 2, 1]
    assert pool.cached_block(chain([1, 2], [3, 4], [5, 10], [11, 12])[-1]) is None  # 6 evicted


def test_eviction_is_lru_and_never_touches_held_blocks():
    s = make_scheduler(num_blocks=9, block_size=2)  # 8 usable blocks of 2
    pool = s.kv.pool
    a, b, c = [1, 2, 3, 4, 5], [7] * 7, [9] * 9

    def step(sampled):
        s.update_from_output(s.schedule(), sampled)

    s.add_request(req(0, a, max_tokens=1))
    step({0: 0})  # finished: blocks 1-3 freed tail first; [1,2] and [3,4] stay cached
    assert list(pool.free_block_ids) == [4, 5, 6, 7, 8, 3, 2, 1] and pool.num_cached_blocks == 2
    s.add_request(req(1, b, max_tokens=1))
    step({1: 0})  # blocks 4-7; 3 full ones cached
    assert list(pool.free_block_ids) == [8, 3, 2, 1, 7, 6, 5, 4] and pool.num_cached_blocks == 5
    s.add_request(req(2, c, max_tokens=2))
    step({2: 0})  # 5 blocks from the head: 8, 3 and evicted 2, 1 (a's prefix), 7 (b's tail)
    assert s.requests[2].block_ids == [8, 3, 2, 1, 7]
    ha, hb = chain(a[:2], a[2:4]), chain(b[:2], b[2:4], b[4:6])
    assert [pool.cached_block(h) for h in ha] == [None, None]
    assert [pool.cached_block(h) for h in hb] == [4, 5, 6] and list(pool.free_block_ids) == [6, 5, 4]
    s.add_request(req(3, b, max_tokens=1))
    p = s.schedule()  # b hits 3 free blocks but needs 1 more: request 2's are held, it waits
    assert p.new_requests == [] and refs(s, [8, 3, 2, 1, 7]) == [1] * 5
    s.update_from_output(p, {2: 0})  # request 2 finishes
    assert list(pool.free_block_ids) == [6, 5, 4, 7, 1, 2, 3, 8]
    (new,) = s.schedule().new_requests
    assert (new.num_computed_tokens, new.block_ids) == (6, [4, 5, 6, 7])
    assert list(pool.free_block_ids) == [1, 2, 3, 8] and refs(s, [4, 5, 6, 7]) == [1] * 4


def test_a_failed_step_caches_nothing():
    s = make_scheduler(num_blocks=17, block_size=4)
    s.add_request(req(0, SYS + [20], max_tokens=4))
    p = s.schedule()
    s.abort_request(0)  # what the step loop does when the executor fails a step
    s.update_from_output(p, {})
    assert s.kv.pool.num_cached_blocks == 0 and s.num_free_blocks == 16
    s.add_request(req(1, SYS + [20], max_tokens=1))
    assert s.schedule().new_requests[0].num_computed_tokens == 0


def test_disabled_prefix_caching_shares_nothing():
    s = make_scheduler(enable_prefix_caching=False)
    streams, plans = run(s, {0: [req(0, SYS, max_tokens=3)], 5: [req(1, SYS, max_tokens=3)]}, ahead=False)
    assert all(r.num_computed_tokens == 0 for p in plans for r in p.new_requests)
    assert s.kv.pool.num_cached_blocks == 0 and s.take_prefix_cache_stats() == (0, 0)
    assert streams[0].token_ids == streams[1].token_ids


def workload(seed: int):
    """Requests over 40 steps: most start with one of two system prompts or repeat an earlier
    prompt (a multi-turn follow-up takes the last prompt plus its expected answer)."""
    rng = random.Random(seed)
    prefixes = [SYS, [5, 6, 7, 8, 9] * 3]
    arrivals, prompts = {}, []
    for req_id in range(24):
        kind = rng.random()
        if prompts and kind < 0.2:
            prompt = rng.choice(prompts)
        elif prompts and kind < 0.35:
            last = prompts[-1]
            prompt = last + reference_tokens(last, 6)[:4] + [rng.randrange(26)]
        else:
            prefix = rng.choice(prefixes) if kind < 0.85 else []
            prompt = prefix + [rng.randrange(26) for _ in range(rng.randint(1, 9))]
        prompt = prompt[:60]
        prompts.append(prompt)
        request = req(req_id, prompt, max_tokens=rng.randint(1, 14))
        arrivals.setdefault(rng.randrange(40), []).append(request)
    aborts = {rng.randrange(40): [rng.randrange(24)] for _ in range(3)}
    return arrivals, aborts


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("pool", ["large", "tiny"])
@pytest.mark.parametrize("ahead", [False, True, 3])
def test_outputs_identical_with_caching_on_and_off(seed, pool, ahead):
    # tiny: 20 usable blocks of 4 and prefill chunks of 6 tokens, so requests get preempted
    sizes = {"large": {}, "tiny": {"num_blocks": 21, "long_prefill_token_threshold": 6}}[pool]
    reference, _ = run(make_scheduler(enable_prefix_caching=False), workload(seed)[0], ahead=False)
    aborted = {r for ids in workload(seed)[1].values() for r in ids}
    for enable in (True, False):
        s = make_scheduler(enable_prefix_caching=enable, **sizes)
        streams, plans = run(s, *workload(seed), ahead=ahead)
        num_hit = sum(r.num_computed_tokens for p in plans for r in p.new_requests)
        assert (num_hit > 0) == enable
        if pool == "tiny":
            preempted, num_resumed_hits = set(), 0  # resumed requests that found their prefix
            for p in plans:
                num_resumed_hits += sum(r.num_computed_tokens > 0 for r in p.new_requests
                                        if r.req_id in preempted)
                preempted.update(p.preempted_req_ids)
            assert preempted and (num_resumed_hits > 0) == enable
        for req_id, stream in reference.items():
            got = streams.get(req_id)
            if req_id in aborted:  # cut wherever the abort fell: a prefix of the reference
                assert got is None or got.token_ids == stream.token_ids[:len(got.token_ids)]
            else:
                assert got == stream, req_id
