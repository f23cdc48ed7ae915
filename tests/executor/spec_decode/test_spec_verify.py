"""The verification rule of speculative decoding (executor_svc/spec_decode/verify.py) on CPU: its
tokens are the sampler's own draws (speculation on gives the tokens of speculation off), follow
the target distribution (chi-square over many seeded draws on a tiny vocabulary) and accept a
draft with probability p(draft); greedy rows accept exactly the argmax; and the plan checks of
verify rows."""

from __future__ import annotations

import pytest
import torch

from executor_svc.sample.ops import SamplingTensors, apply_top_k_top_p
from executor_svc.spec_decode import verify
from executor_svc.worker.plan_checks import PlanError
from step_protocol.domain import NewRequestData, SamplerParams, StepPlan
from tests.executor.conftest import cached_rows, make_runner

V = 6


def params_of(temperature, top_k, top_p, seeds, positions, fused=False):
    return SamplingTensors(temperature, top_k, top_p, seeds, positions, all_greedy=False,
                           need_top_k_top_p=not fused)


def match_drafts(logits, drafts, temperature, top_k, top_p, seeds, positions, fused=False):
    """verify.match_drafts over per-position columns, on the sampler's general path (top-k /
    top-p cut) or, fused, on its one-pass draw of rows without a cut (kernels.gumbel_sample)."""
    return verify.match_drafts(logits, drafts, params_of(temperature, top_k, top_p, seeds, positions, fused))

# chi-square quantile at p = 0.999 for V - 1 = 5 degrees of freedom (fewer when some p = 0)
CHI2_999 = {5: 20.52, 4: 18.47, 3: 16.27, 2: 13.82, 1: 10.83}


def draw(logits, draft, temperature, top_k=0, top_p=1.0, n=40000, position=11, fused=False):
    """n draws of one position's token (accepted draft or recovered), seeds 0..n-1."""
    rows = logits[None].expand(n, V).contiguous()
    accepted, recovered = match_drafts(
        rows, torch.full((n,), draft), torch.full((n,), temperature), torch.full((n,), top_k),
        torch.full((n,), top_p), torch.arange(n, dtype=torch.int64) * 7919 + 3,
        torch.full((n,), position, dtype=torch.int64), fused)
    return torch.where(accepted, torch.full_like(recovered, draft), recovered), accepted


def target(logits, temperature, top_k=0, top_p=1.0):
    scaled = apply_top_k_top_p((logits / temperature)[None], torch.tensor([top_k]), torch.tensor([top_p]))
    return scaled.softmax(dim=-1)[0]


def chi_square(tokens, p):
    counts = torch.bincount(tokens, minlength=V).double()
    n = len(tokens)
    live = p > 0
    assert counts[~live].sum() == 0, "drew a token the target cannot produce"
    expected = p[live].double() * n
    return float(((counts[live] - expected) ** 2 / expected).sum()), int(live.sum()) - 1


LOGITS = torch.tensor([2.0, 0.5, -1.0, 1.2, 0.0, -0.4])


@pytest.mark.parametrize("draft", [0, 2, 3])  # the likeliest, an unlikely and a middle token
@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 4, 1.0),
                                                     (1.0, 0, 0.8)])
def test_rejection_sampling_matches_the_target(draft, temperature, top_k, top_p):
    p = target(LOGITS, temperature, top_k, top_p)
    tokens, accepted = draw(LOGITS, draft, temperature, top_k, top_p)
    stat, dof = chi_square(tokens, p)
    assert stat < CHI2_999[dof], (stat, tokens.bincount(minlength=V), p)
    # accepted with probability p(draft): a binomial within 5 sigma
    n, q = len(tokens), float(p[draft])
    assert abs(float(accepted.double().sum()) - n * q) <= 5 * (n * q * (1 - q)) ** 0.5 + 1


@pytest.mark.parametrize("draft", [0, 2, 3])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_fused_rule_of_rows_without_a_cut_matches_the_target(draft, temperature):
    p = target(LOGITS, temperature)
    tokens, accepted = draw(LOGITS, draft, temperature, fused=True)
    stat, dof = chi_square(tokens, p)
    assert stat < CHI2_999[dof], (stat, tokens.bincount(minlength=V), p)
    n, q = len(tokens), float(p[draft])
    assert abs(float(accepted.double().sum()) - n * q) <= 5 * (n * q * (1 - q)) ** 0.5 + 1


@pytest.mark.parametrize("fused", [False, True])
def test_the_tokens_are_the_samplers_draws(fused):
    """Speculation on gives the tokens of speculation off: at every position the rule's token is
    ops.sample's draw of the same row, and a draft is accepted iff it is that draw. (The classic
    rule, accepting with a separate uniform u < p(draft), fails this: it accepts drafts the
    sampler would not draw and rejects some it would.)"""
    from executor_svc.sample.ops import sample

    n = 4000
    logits = torch.randn(n, V, generator=torch.Generator().manual_seed(3))
    args = (torch.full((n,), 1.0), torch.zeros(n, dtype=torch.int64), torch.ones(n),
            torch.arange(n, dtype=torch.int64) * 31 + 7, torch.arange(n, dtype=torch.int64) % 97)
    drawn = sample(logits, params_of(*args, fused=fused))
    drafts = torch.where(torch.arange(n) % 2 == 0, drawn, torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(4)))
    accepted, recovered = match_drafts(logits, drafts, *args, fused=fused)
    assert torch.equal(recovered, drawn)
    assert torch.equal(accepted, drafts == drawn)
    assert 0.55 < float(accepted.float().mean()) < 0.75  # every even draft, and 1 in ~V of the rest


def test_a_wrong_rule_fails_the_test():
    """The chi-square test has power: recovering from p itself (the draft not removed) is off."""
    p = target(LOGITS, 1.0)
    tokens, accepted = draw(LOGITS, 0, 1.0)
    wrong = tokens.clone()
    rejected = ~accepted
    wrong[rejected] = torch.multinomial(p, int(rejected.sum()), replacement=True, generator=torch.Generator().manual_seed(0))
    assert chi_square(wrong, p)[0] > CHI2_999[5]


def test_greedy_accepts_exactly_the_argmax_and_draws_replay():
    logits = torch.randn(8, V, generator=torch.Generator().manual_seed(1))
    drafts = torch.tensor([0, 1, 2, 3, 4, 5, 0, 1])
    zeros = torch.zeros(8)
    args = (torch.zeros(8, dtype=torch.int64), torch.ones(8), torch.arange(8), torch.arange(8) + 5)
    accepted, recovered = match_drafts(logits, drafts, zeros, *args)
    assert torch.equal(accepted, logits.argmax(-1) == drafts)
    assert torch.equal(recovered, logits.argmax(-1))
    a1, r1 = match_drafts(logits, drafts, zeros + 1, *args)
    a2, r2 = match_drafts(logits, drafts, zeros + 1, *args)
    assert torch.equal(a1, a2) and torch.equal(r1, r2)
    assert bool((r1[~a1] != drafts[~a1]).all())  # a recovered token is never the draft


def test_verify_rows_are_checked(model_dirs):
    runner = make_runner(model_dirs["tiny-llama"], num_kv_blocks=32, block_size=16)
    new = NewRequestData(1, [5, 6, 7, 8], SamplerParams(), [1], 0, 4)
    runner.execute(StepPlan(0, new_requests=[new]))
    bad_plans = [  # draft columns that do not fit the rows: the whole plan is refused
        StepPlan(1, cached_requests=cached_rows((1, 2)), num_draft_tokens=[2], draft_token_ids=[5]),
        StepPlan(1, cached_requests=cached_rows((1, 2)), num_draft_tokens=[1, 0], draft_token_ids=[5]),
    ]
    for plan in bad_plans:
        with pytest.raises(PlanError):
            runner.launch(plan)
    bad_rows = [  # one row's drafts: that row fails alone and is forgotten
        (StepPlan(1, cached_requests=cached_rows((1, 3)), num_draft_tokens=[1], draft_token_ids=[5]),
         "1 drafts need a decode row of 2 tokens"),  # 1 + 1 != 3
        (StepPlan(1, cached_requests=cached_rows((1, 2)), num_draft_tokens=[1], draft_token_ids=[10 ** 6]),
         "draft token id 1000000 is outside the vocabulary"),
    ]
    for plan, message in bad_rows:
        result = runner.execute(plan)
        assert result.failed_req_ids == [1] and message in result.failed_errors[0]
        assert 1 not in runner.batch.requests
        runner.execute(StepPlan(0, new_requests=[new]))  # sent again, as after a preemption
    lp = NewRequestData(2, [5, 6, 7], SamplerParams(logprobs=2), [2], 0, 3)
    runner.execute(StepPlan(1, new_requests=[lp]))
    result = runner.execute(StepPlan(2, cached_requests=cached_rows((2, 2)), num_draft_tokens=[1],
                                     draft_token_ids=[5]))
    assert result.failed_req_ids == [2] and "logprobs" in result.failed_errors[0]
    # a good verify row: 1 + 2 tokens, answered with 1 to 3 tokens, the greedy continuation's
    result = runner.execute(StepPlan(2, cached_requests=cached_rows((1, 3)), num_draft_tokens=[2],
                                     draft_token_ids=[5, 6]))
    assert result.req_ids == [1] and len(result.num_tokens) == 1 and 1 <= result.num_tokens[0] <= 3
    assert len(result.token_ids) == result.num_tokens[0]
