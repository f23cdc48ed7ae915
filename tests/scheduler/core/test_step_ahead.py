"""Outputs are identical whether the caller runs synchronously or one step ahead."""

import pytest

from tests.scheduler.sched_driver import (EOS, letter, make_scheduler, reference_tokens, req, run)
from scheduler_svc.core.request import FinishReason


def text_of(tokens):
    return "".join(letter(t) for t in tokens)


def full_index_end(tokens, stop):
    text = text_of(tokens)
    return text.index(stop) + len(stop)


def scenario():
    """Requests arriving over time with every kind of stop; returns {step: [requests]}."""
    arrivals = {}
    for i in range(14):
        prompt = [(i * 5 + j) % 26 for j in range(2 + (i * 7) % 19)]
        params = dict(max_tokens=6 + (i * 5) % 24)
        expected = text_of(reference_tokens(prompt, 40))
        if i % 4 == 1:  # a stop string taken from what the model will write
            params["stop"] = (expected[4:6], "zzzz")
        if i % 4 == 2:
            params["stop_token_ids"] = (reference_tokens(prompt, 40)[3],)
        if i % 5 == 3:
            params["ignore_eos"] = True
        arrivals.setdefault(i // 2 * 3, []).append(req(i, prompt, **params))
    # Context full: 28 prompt tokens, room for 4 more under max_model_len=32.
    arrivals.setdefault(1, []).append(req(100, [3] * 28, max_tokens=20))
    return arrivals


CONFIGS = {
    "roomy": dict(),
    "tiny-pool": dict(num_blocks=13, block_size=4),
    "chunked": dict(max_num_batched_tokens=7, long_prefill_token_threshold=5),
    "few-seats": dict(max_num_seqs=3, num_blocks=17, block_size=2),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_sync_and_one_step_ahead_give_identical_outputs(name):
    reference, _ = run(make_scheduler(max_model_len=32), scenario(), ahead=False)
    reasons = {(s.finish_reason, bool(s.matched_stop)) for s in reference.values()}
    assert reasons >= {(FinishReason.LENGTH, False), (FinishReason.EOS, False),
                       (FinishReason.STOP, True)}
    assert reference[100].num_outputs == 4 and reference[100].finish_reason == FinishReason.LENGTH
    for ahead in (False, True, 3, 4):
        streams, plans = run(make_scheduler(max_model_len=32, **CONFIGS[name]), scenario(),
                             ahead=ahead)
        assert streams == reference, (name, ahead)
        if name == "tiny-pool":
            assert any(p.preempted_req_ids for p in plans)


def test_outputs_follow_the_model_and_the_stop_rules():
    streams, _ = run(make_scheduler(max_model_len=32), scenario(), ahead=True)
    for arrivals in scenario().values():
        for r in arrivals:
            s = streams[r.req_id]
            tokens = reference_tokens(r.prompt_token_ids, len(s.token_ids))
            assert s.token_ids == tokens
            if s.finish_reason == FinishReason.EOS:
                assert tokens[-1] == EOS and s.text == text_of(tokens[:-1])
            elif s.finish_reason == FinishReason.STOP and s.matched_stop in r.params.stop:
                full, end = text_of(tokens), full_index_end(tokens, s.matched_stop)
                assert s.text == full[:full.index(s.matched_stop)]
                assert end > len(text_of(tokens[:-1]))  # it stopped at the first match
            elif s.finish_reason == FinishReason.STOP:
                assert tokens[-1] in r.params.stop_token_ids and s.text == text_of(tokens[:-1])
                assert s.matched_stop == str(tokens[-1])
            else:
                assert s.finish_reason == FinishReason.LENGTH and s.text == text_of(tokens)


def test_abort_under_both_patterns():
    aborted = {2, 5, 9}
    aborts = {4: [2], 7: [5], 12: [9]}
    reference, _ = run(make_scheduler(max_model_len=32), scenario(), ahead=False)
    for ahead in (False, True, 3, 4):
        streams, _ = run(make_scheduler(max_model_len=32, num_blocks=13, block_size=4),
                         scenario(), aborts, ahead=ahead)  # run() checks every block came back
        for req_id, s in streams.items():
            if req_id in aborted:
                assert s.finish_reason is None  # the caller stopped listening: no final output
                n = len(s.token_ids)
                assert s.token_ids == reference[req_id].token_ids[:n]
            else:
                assert s == reference[req_id]


def test_token_after_finish_is_discarded():
    s = make_scheduler()
    s.add_request(req(0, [1, 2], max_tokens=10))
    s.add_request(req(1, [3, 4], max_tokens=10))
    p0 = s.schedule()
    p1 = s.schedule()  # planned before step 0's tokens are known
    outs = s.update_from_output(p0, {0: EOS, 1: 5})
    assert [(o.req_id, o.finish_reason) for o in outs] == [(0, FinishReason.EOS), (1, None)]
    assert outs[0].new_text == ""  # EOS is kept as a token, not as text
    free = s.num_free_blocks
    p2 = s.schedule()
    assert p2.finished_req_ids == [0]
    assert p2.cached_requests.req_ids == [1]
    outs = s.update_from_output(p1, {0: 9, 1: 6})  # 9 is the wasted token: never returned
    assert [(o.req_id, o.new_token_ids) for o in outs] == [(1, [6])]
    assert s.num_free_blocks == free + 1  # request 0's block came back only now
    assert 0 not in s.requests


def test_length_limited_request_is_not_scheduled_past_its_last_token():
    s = make_scheduler()
    s.add_request(req(0, [1, 2], max_tokens=1))
    p0 = s.schedule()
    p1 = s.schedule()  # its only token is in flight: nothing more to compute
    assert not p1.has_rows()
    outs = s.update_from_output(p0, {0: 4})
    assert outs[0].finish_reason == FinishReason.LENGTH
    assert s.update_from_output(p1, {}) == []
    assert s.schedule().finished_req_ids == [0]
