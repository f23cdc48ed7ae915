"""Speculative decoding with method draft_model in the scheduler core: the config, the
handshake check, plans carrying draft counts only (DraftSlots), settling results whose drafts
the scheduler never saw, and the step loop against a fake executor whose "draft model" guesses
right most of the time (outputs equal those without speculation; cancellation and the block
accounting stay exact)."""

from __future__ import annotations

import pytest

from llmserve.speculative import SpecDecodeConfig, parse_speculative_config
from scheduler_svc.core.logprobs import StepResultError
from scheduler_svc.core.spec.decoder import check_executor
from step_protocol.domain import DraftSlots, ExecutorInfo
from tests.scheduler.core.spec.test_decoder import (
    SPEC,
    SpecFakeExecutor,
    cancel_mid_verify,
    model,
    same,
    scenario,
)
from tests.scheduler.core.spec.test_decoder import drive as spec_drive
from tests.scheduler.sched_driver import make_scheduler, req

DRAFT = SpecDecodeConfig("draft_model", num_speculative_tokens=3, model="/models/draft")


def guess(tokens: list[int]) -> int:
    """The fake draft model: the target's token, but wrong at every 5th position."""
    return model(tokens) if len(tokens) % 5 else model(tokens) + 1


class DraftFakeExecutor(SpecFakeExecutor):
    """SpecFakeExecutor whose drafts come from `guess` (greedy, as the draft model's), for
    plans carrying draft counts without ids; chained rows as SpecFakeExecutor's (void unless
    the request's previous verify row accepted every draft)."""

    def execute(self, plan):
        assert not plan.draft_token_ids, "a draft-model plan carries counts only"
        self.chained = {r for r, c in zip(plan.cached_requests.req_ids, plan.draft_chained) if c}
        self.drafts = {}
        for req_id, d in zip(plan.cached_requests.req_ids, plan.num_draft_tokens):
            tokens = list(self.rows[req_id].token_ids)
            for _ in range(d):
                tokens.append(guess(tokens))
            self.drafts[req_id] = tokens[len(tokens) - d:] if d else []
        result = super(SpecFakeExecutor, self).execute(plan)
        if plan.num_draft_tokens:
            lists = [t if isinstance(t, list) else [t] for t in result.token_ids]
            result.token_ids = [t for tokens in lists for t in tokens]
            result.num_tokens = [len(tokens) for tokens in lists]
        return result


def drive(spec, arrivals, aborts=None, depth=1, **config):
    return spec_drive(spec, arrivals, aborts, depth, executor_class=DraftFakeExecutor, **config)


def test_parse_draft_model_config():
    text = '{"method": "draft_model", "model": "/models/draft", "num_speculative_tokens": 3}'
    assert parse_speculative_config(text) == DRAFT
    assert parse_speculative_config('{"model": "/models/draft", "num_speculative_tokens": 3}') == DRAFT
    for bad in ('{"method": "draft_model", "num_speculative_tokens": 3}',  # no model
                '{"model": "", "num_speculative_tokens": 3}', '{"model": 5, "num_speculative_tokens": 3}',
                '{"model": "/d"}', '{"model": "/d", "num_speculative_tokens": 2, "prompt_lookup_max": 3}'):
        with pytest.raises(ValueError):
            parse_speculative_config(bad)


def info(draft: str) -> ExecutorInfo:
    return ExecutorInfo("m", "/m", 64, (0,), 64, 4, 32, (), 8, 64, "cpu", "float32", draft_model_path=draft)


def test_handshake_check():
    with pytest.raises(ValueError) as e:
        check_executor(DRAFT, info(""))
    assert str(e.value) == ("--speculative-config method draft_model: the executor has no draft model "
                            "(start it with the same --speculative-config, naming the draft's \"model\")")
    with pytest.raises(ValueError, match="method ngram: the executor proposes with its draft model /d"):
        check_executor(SPEC, info("/d"))
    check_executor(DRAFT, info("/d"))
    check_executor(SPEC, info(""))
    check_executor(None, info("/d"))  # speculation off: the draft only keeps its KV


def test_settle_checks_the_count_only():
    s = make_scheduler(speculative=DRAFT, num_blocks=32, block_size=4)
    s.add_request(req(0, [1, 2, 3, 4], max_tokens=30, ignore_eos=True))
    request = s.requests[0]
    s.spec.record(request, 0, DraftSlots(3), chained=False)
    request.num_computed_tokens = 8
    with pytest.raises(StepResultError):
        s.spec.settle(request, [5, 6, 7, 8, 9])  # 4 drafts accepted of 3
    s.spec.record(request, 1, DraftSlots(3), chained=False)
    assert s.spec.settle(request, [9, 8]) == 2  # any tokens: the scheduler never saw the drafts
    assert s.take_spec_decode_stats() == (1, 3, 1)


@pytest.mark.parametrize("depth", [1, 3])
@pytest.mark.parametrize("budget", [32, 7])
def test_outputs_equal_without_speculation(depth, budget):
    reference, _, _ = drive(None, scenario(), max_model_len=32, max_num_batched_tokens=budget)
    streams, plans, s = drive(DRAFT, scenario(), depth=depth, max_model_len=32, max_num_batched_tokens=budget)
    assert same(streams, reference)
    assert all(p.num_scheduled_tokens <= budget and not p.draft_token_ids for p in plans)
    assert any(p.num_draft_tokens for p in plans)
    stats = s.spec.stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens


def test_cancel_mid_speculation_frees_every_block():
    def check(plan, s, total):  # its token and 3 drafts the executor proposes
        assert (plan.num_draft_tokens, plan.draft_token_ids) == ([3], [])
        assert plan.cached_requests.num_scheduled_tokens == [4] and s.num_free_blocks == total - 4

    cancel_mid_verify(DRAFT, DraftFakeExecutor, check)
