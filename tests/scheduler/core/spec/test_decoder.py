"""Speculative decoding in the scheduler core: the n-gram proposer, the config, and the step
loop against a fake executor that verifies drafts greedily (outputs must equal those without
speculation; stops, max_tokens, cancellation and the block accounting stay exact)."""

from __future__ import annotations

import pytest

from llmserve.speculative import SpecDecodeConfig, parse_speculative_config
from llmserve.structured import constraint as sc
from scheduler_svc.core.request import FinishReason
from scheduler_svc.core.spec.ngram import propose_ngram
from tests.scheduler.sched_driver import FakeExecutor, fake_next_token, make_scheduler, req, run

SPEC = SpecDecodeConfig("ngram", num_speculative_tokens=4, prompt_lookup_max=4, prompt_lookup_min=2)


def model(tokens: list[int]) -> int:
    """Mostly continues a period-3 pattern (drafts accepted), every 7th position not (rejected)."""
    return fake_next_token(tokens) if len(tokens) % 7 == 0 else tokens[-3]


class SpecFakeExecutor(FakeExecutor):
    """The fake executor (KV and block checks included) verifying drafts against `model`: a
    verify row writes the KV of its last token and its drafts, answers the accepted drafts
    and one more token, and forgets the rejected drafts' positions. A chained row (planned
    before the previous verify row's result) runs only if that row accepted every draft, else
    it is void: it answers no token and writes nothing (the real executor's device flag)."""

    def __init__(self, block_size: int):
        super().__init__(block_size)
        self.drafts: dict[int, list[int]] = {}
        self.chained: set[int] = set()
        self.chain_ok: dict[int, bool] = {}  # req_id -> its last verify row accepted all
        self.num_verify_rows = self.num_chained_rows = self.num_void_rows = 0

    def execute(self, plan):
        self.drafts, i = {}, 0
        for req_id, d in zip(plan.cached_requests.req_ids, plan.num_draft_tokens):
            self.drafts[req_id] = plan.draft_token_ids[i:i + d]
            i += d
        assert i == len(plan.draft_token_ids)
        self.chained = {r for r, c in zip(plan.cached_requests.req_ids, plan.draft_chained) if c}
        assert all(self.drafts.get(r) for r in self.chained), "a chained row without drafts"
        result = super().execute(plan)
        if plan.num_draft_tokens:
            lists = [t if isinstance(t, list) else [t] for t in result.token_ids]
            result.token_ids = [t for tokens in lists for t in tokens]
            result.num_tokens = [len(tokens) for tokens in lists]
        return result

    def _run(self, step_id, req_id, row, num_tokens):
        drafts = self.drafts.get(req_id, [])
        assert num_tokens == 1 + len(drafts) or not drafts
        if req_id in self.chained:
            self.num_chained_rows += 1
            if not self.chain_ok[req_id]:
                self.num_void_rows += 1
                return []
        base, start = len(row.token_ids), row.num_computed_tokens
        row.token_ids += drafts
        if super()._run(step_id, req_id, row, num_tokens) is None:
            assert not drafts
            return None
        del row.token_ids[base:]
        tokens: list[int] = []
        while True:
            tokens.append(model(row.token_ids + tokens))
            if len(tokens) > len(drafts) or drafts[len(tokens) - 1] != tokens[-1]:
                break
        row.token_ids += tokens
        row.num_computed_tokens = start + num_tokens - (len(drafts) - (len(tokens) - 1))  # - rejected
        self.num_verify_rows += bool(drafts)
        self.chain_ok[req_id] = len(tokens) - 1 == len(drafts)
        return tokens if drafts else tokens[0]


def same(a, b) -> bool:
    """The same streams but for the number of messages (a verify step sends its tokens in one)."""
    def key(streams):
        return {r: (x.token_ids, x.text, x.finish_reason, x.matched_stop) for r, x in streams.items()}
    return key(a) == key(b)


def drive(spec, arrivals, aborts=None, depth=1, executor_class=None, **config):
    scheduler = make_scheduler(speculative=spec, **config)
    executor = (executor_class or SpecFakeExecutor)(scheduler.config.block_size)
    streams, plans = run(scheduler, arrivals, aborts, ahead=depth, executor=executor)
    return streams, plans, scheduler


def test_propose_ngram():
    assert propose_ngram([1, 2, 3, 9, 1, 2], 2, 4, 3) == [3, 9, 1]
    assert propose_ngram([1, 2, 3, 9, 1, 2], 2, 4, 1) == [3]
    # the longest suffix first: [7, 1, 2] matches at its second occurrence only
    assert propose_ngram([7, 1, 2, 5, 1, 2, 6, 7, 1, 2], 2, 3, 2) == [5, 1]
    assert propose_ngram([4, 1, 2, 5, 1, 2, 6, 7, 1, 2], 2, 3, 2) == [6, 7]  # latest 2-gram
    assert propose_ngram([1, 2, 3, 4], 2, 4, 4) == []  # no earlier occurrence
    assert propose_ngram([1, 2, 3, 1], 2, 4, 4) == []  # shorter than prompt_lookup_min
    assert propose_ngram([1, 2, 3, 1], 1, 4, 4) == [2, 3, 1]
    assert propose_ngram([5, 5, 5, 5], 2, 2, 4) == [5]  # a match ending right before the suffix
    assert propose_ngram([5], 1, 4, 4) == []


def test_parse_speculative_config():
    assert parse_speculative_config("") is None
    text = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
    assert parse_speculative_config(text) == SPEC
    assert parse_speculative_config('{"num_speculative_tokens": 3, "prompt_lookup_max": 6}') == \
        SpecDecodeConfig("ngram", 3, 6, 6)
    assert parse_speculative_config('{"num_speculative_tokens": 3}') == SpecDecodeConfig("ngram", 3, 5, 5)
    for bad in ('{"method": "eagle", "num_speculative_tokens": 3}', '{"prompt_lookup_max": 3}',
                '{"num_speculative_tokens": 0}', '{"method": "ngram", "num_speculative_tokens": 2, "model": "x"}',
                '{"num_speculative_tokens": 2, "prompt_lookup_min": 5, "prompt_lookup_max": 3}',
                '[1]', 'ngram'):
        with pytest.raises(ValueError):
            parse_speculative_config(bad)


def scenario():
    arrivals = {}
    for i in range(10):
        prompt = [(i * 5 + j) % 26 for j in range(3)] * (2 + i % 3) + [i % 26]
        params = dict(max_tokens=5 + (i * 7) % 30)
        expected = [model(prompt)]
        if i % 4 == 1:
            params["stop"] = ("".join(chr(97 + t) for t in [prompt[-3], prompt[-2]]), "zzzz")
        if i % 4 == 2:
            params["stop_token_ids"] = (expected[0] + 1,)
        if i % 3 == 0:
            params["ignore_eos"] = True
        arrivals.setdefault(i // 2 * 3, []).append(req(i, prompt, **params))
    arrivals.setdefault(1, []).append(req(100, [3, 4, 5] * 9 + [3], max_tokens=20))  # context full
    return arrivals


@pytest.mark.parametrize("depth", [1, 2, 3])
@pytest.mark.parametrize("budget", [32, 7])
def test_outputs_equal_without_speculation(depth, budget):
    reference, _, _ = drive(None, scenario(), max_model_len=32, max_num_batched_tokens=budget)
    streams, plans, s = drive(SPEC, scenario(), depth=depth, max_model_len=32,
                              max_num_batched_tokens=budget)
    assert same(streams, reference)
    assert all(p.num_scheduled_tokens <= budget for p in plans)
    stats = s.spec.stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    assert {r.finish_reason for r in reference.values()} >= {FinishReason.STOP, FinishReason.LENGTH}


def test_stop_and_max_tokens_inside_accepted_drafts():
    prompt = [1, 2, 3] * 5  # the model continues it up to position 20
    cases = [dict(max_tokens=30, stop_token_ids=(3,)), dict(max_tokens=4), dict(max_tokens=30, stop=("db",)),
             dict(max_tokens=2)]
    for params in cases:
        ref, _, _ = drive(None, {0: [req(0, prompt, **params)]})
        out, plans, s = drive(SPEC, {0: [req(0, prompt, **params)]})
        assert same(out, ref), params
        assert s.spec.stats.num_draft_tokens > 0 or params["max_tokens"] <= 2
    out, plans, s = drive(SPEC, {0: [req(0, prompt, max_tokens=30, stop_token_ids=(3,))]})
    assert out[0].token_ids == [1, 2, 3] and out[0].finish_reason is FinishReason.STOP
    assert plans[1].draft_token_ids == [2, 3, 1]  # the stop came inside accepted drafts
    out, plans, _ = drive(SPEC, {0: [req(0, prompt, max_tokens=4)]})
    assert out[0].token_ids == [1, 2, 3, 1] and out[0].finish_reason is FinishReason.LENGTH
    assert plans[1].draft_token_ids == [2, 3]  # 1 + 2 drafts reach max_tokens exactly



def test_a_constrained_request_gets_no_drafts():
    """Speculation is off for structured-output rows by design (drafts are not checked against
    the grammar; the executor refuses drafts on such a row): the same repeating prompt is
    speculated unconstrained, never with a constraint, and the other row keeps speculating."""
    prompt = [1, 2, 3] * 5
    only = sc.regex(r"[a-z]+", "structured_outputs.regex")
    out, plans, s = drive(SPEC, {0: [req(0, prompt, max_tokens=12, constraint=only,
                                         grammar=sc.to_grammar(only)),
                                     req(1, prompt, max_tokens=12)]})
    drafted = {r for p in plans for r, d in zip(p.cached_requests.req_ids, p.num_draft_tokens) if d}
    assert drafted == {1} and s.spec.stats.num_draft_tokens > 0
    assert len(out[0].token_ids) == len(out[1].token_ids) == 12

def test_prefix_cache_never_shares_rejected_drafts_kv():
    """A later request whose prompt is an earlier one's whole output hits the blocks that
    decode (and verify) steps wrote; the fake executor checks every hit block's KV."""
    prompt = [1, 2, 3] * 3
    first, _, _ = drive(None, {0: [req(0, prompt, max_tokens=40, ignore_eos=True)]})
    follow = prompt + first[0].token_ids
    def arrivals():
        return {0: [req(0, prompt, max_tokens=40, ignore_eos=True)],
                60: [req(1, follow, max_tokens=5, ignore_eos=True)]}
    ref, _, _ = drive(None, arrivals(), max_model_len=128)
    out, _, s = drive(SPEC, arrivals(), max_model_len=128)
    assert s.kv.pool.blocks  # (the fake executor asserted each hit block's KV: prefix cache on)
    assert same(out, ref)
    assert s.spec.stats.num_draft_tokens > s.spec.stats.num_accepted_tokens > 0


def cancel_mid_verify(spec, executor_class, check_verify_plan) -> None:
    """A request cancelled while its verify step is in flight: its blocks stay held until the
    step is applied, then all come back. check_verify_plan(plan, scheduler, total blocks)
    asserts the verify row's plan (its token and 3 drafts, slots 12..15)."""
    s = make_scheduler(speculative=spec, num_blocks=32, block_size=4)
    executor = executor_class(4)
    s.add_request(req(0, [1, 2, 3] * 4, max_tokens=30))
    total = s.num_total_blocks
    plan = s.schedule()  # the prompt: 12 tokens, 3 blocks
    s.update_from_output(plan, executor.execute(plan).sampled())
    executor.applied(plan.step_id)
    plan = s.schedule()
    check_verify_plan(plan, s, total)
    result = executor.execute(plan)
    s.abort_request(0)  # while the verify step is in flight: its blocks stay held
    assert s.num_free_blocks == total - 4
    assert s.update_from_output(plan, result.sampled(), result) == []
    assert s.num_free_blocks == total and not s.requests
    assert s.schedule().finished_req_ids == [0]


def test_cancel_mid_speculation_frees_every_block():
    def check(plan, s, total):
        assert plan.draft_token_ids == [2, 3, 1] and plan.cached_requests.num_scheduled_tokens == [4]
        assert plan.cached_requests.new_block_ids == [4] and s.num_free_blocks == total - 4

    cancel_mid_verify(SPEC, SpecFakeExecutor, check)


def test_rejected_drafts_move_computed_back():
    s = make_scheduler(speculative=SPEC, num_blocks=32, block_size=4)
    executor = SpecFakeExecutor(4)
    s.add_request(req(0, [1, 2, 3] * 4 + [1], max_tokens=30, ignore_eos=True))
    plan = s.schedule()
    s.update_from_output(plan, executor.execute(plan).sampled())
    request = s.requests[0]
    plan = s.schedule()
    drafts = plan.draft_token_ids
    assert drafts and request.num_computed_tokens == request.num_tokens + len(drafts)
    result = executor.execute(plan)
    tokens = result.sampled()[0]
    s.update_from_output(plan, result.sampled(), result)
    accepted = len(tokens) - 1
    assert accepted < len(drafts)  # model: a different token at position 14 than the lookup's
    assert request.num_computed_tokens == request.num_tokens - 1
    assert request.num_written_tokens == request.num_tokens - 1
    assert (s.spec.stats.num_drafts, s.spec.stats.num_draft_tokens,
            s.spec.stats.num_accepted_tokens) == (1, len(drafts), accepted)
    assert s.take_spec_decode_stats() == (1, len(drafts), accepted)
    assert s.take_spec_decode_stats() == (0, 0, 0)
