"""Chained verify rows on the real runner (CPU, fp32, tiny-llama): a verify row launched while
the request's previous verify row is still running, positioned as if that row accepted every
draft. When it did, the chained row's tokens are the greedy continuation; when it did not, the
chained row is void (no token, its slots given back, the row's last token kept) and the next
step continues exactly as without speculation."""

from __future__ import annotations

from unittest import mock

import pytest

from executor_svc.worker.plan_checks import PlanError
from step_protocol.domain import NewRequestData, SamplerParams, StepPlan
from tests.executor.conftest import cached_rows, make_runner

PROMPT = [5, 6, 7, 8, 9, 10]


def greedy(runner, n: int) -> list[int]:
    """The greedy continuation of PROMPT, one decode step a token (the reference)."""
    runner.reset()
    tokens = runner.execute(StepPlan(0, new_requests=[NewRequestData(1, PROMPT, SamplerParams(), [1], 0, 6)])).token_ids
    for step in range(1, n):
        tokens += runner.execute(StepPlan(step, cached_requests=cached_rows((1, 1)))).token_ids
    return tokens


def verify_row(step_id: int, drafts: list[int], chained: bool = False) -> StepPlan:
    return StepPlan(step_id, cached_requests=cached_rows((1, 1 + len(drafts))), num_draft_tokens=[len(drafts)],
                    draft_token_ids=drafts, draft_chained=[True] if chained else [])


@pytest.fixture(scope="module", params=["greedy tail", "scan"])
def runner(model_dirs, request):
    """Both verify paths: the greedy tail of token rows (spec_decode/verify_tail.py), and the
    logits rows' argmax with the scan kernel (a step not laid out as token rows)."""
    runner = make_runner(model_dirs["tiny-llama"], num_kv_blocks=32, block_size=16)
    if request.param == "greedy tail":
        yield runner
        return
    with mock.patch("executor_svc.worker.model_runner.use_token_rows", return_value=False):
        yield runner


def start(runner) -> int:
    runner.reset()
    new = NewRequestData(1, PROMPT, SamplerParams(), [1], 0, 6)
    return runner.execute(StepPlan(0, new_requests=[new])).token_ids[0]


def accept_then_reject(runner, ref: list[int]) -> None:
    """After start(runner): a verify row whose 3 drafts are all accepted, then one whose second
    draft is rejected (its token instead), then a plain decode step over the rolled-back slots;
    ref: the greedy continuation (greedy())."""
    assert start(runner) == ref[0]
    r = runner.execute(verify_row(1, ref[1:4]))  # 3 drafts, all accepted, then the bonus token
    assert (r.token_ids, r.num_tokens) == (ref[1:5], [4])
    wrong = (ref[6] + 1) % 50
    r = runner.execute(verify_row(2, [ref[5], wrong, ref[7]]))  # the second rejected: its token instead
    assert (r.token_ids, r.num_tokens) == (ref[5:7], [2])
    r = runner.execute(StepPlan(3, cached_requests=cached_rows((1, 1))))  # the rolled-back slots given back
    assert r.token_ids == [ref[7]]


def test_a_chained_row_after_a_full_acceptance_continues_exactly(runner):
    ref = greedy(runner, 10)
    assert start(runner) == ref[0]
    h1 = runner.launch(verify_row(1, ref[1:3]))  # accepts both: ref[1], ref[2], bonus ref[3]
    h2 = runner.launch(verify_row(2, ref[4:6], chained=True))  # first token: h1's bonus (ref[3])
    r1, r2 = runner.finish(h1), runner.finish(h2)
    assert (r1.token_ids, r1.num_tokens) == (ref[1:4], [3])
    assert (r2.token_ids, r2.num_tokens) == (ref[4:7], [3])
    row = runner.batch.requests[1].row
    assert runner.batch.num_computed[row] == len(PROMPT) + 6  # 6 + 3 + 3 slots, none rolled back
    r3 = runner.execute(StepPlan(3, cached_requests=cached_rows((1, 1))))
    assert r3.token_ids == [ref[7]]


def test_a_chained_row_after_a_rejection_is_void_and_changes_nothing(runner):
    ref = greedy(runner, 10)
    assert start(runner) == ref[0]
    wrong = (ref[2] + 1) % 50
    h1 = runner.launch(verify_row(1, [ref[1], wrong]))  # accepts ref[1], then draws ref[2]
    h2 = runner.launch(verify_row(2, ref[4:6], chained=True))  # void: h1 rejected a draft
    h3 = runner.launch(verify_row(3, ref[7:9], chained=True))  # void too: its chain broke
    r1, r2, r3 = runner.finish(h1), runner.finish(h2), runner.finish(h3)
    assert (r1.token_ids, r1.num_tokens) == (ref[1:3], [2])
    assert (r2.token_ids, r2.num_tokens) == ([], [0])
    assert (r3.token_ids, r3.num_tokens) == ([], [0])
    # the next plan applies the rollbacks (1 rejected draft, 3 + 3 void slots) first
    r4 = runner.execute(StepPlan(4, cached_requests=cached_rows((1, 1))))
    assert r4.token_ids == [ref[3]]  # fed ref[2] (h1's last token, not a void row's) at position 8
    assert runner.batch.num_computed[runner.batch.requests[1].row] == len(PROMPT) + 3
    r5 = runner.execute(verify_row(5, ref[4:6]))  # speculation goes on from the true length
    assert r5.token_ids == ref[4:7]


def test_chained_rows_are_checked(runner):
    start(runner)
    with pytest.raises(PlanError, match="draft_chained has 2 entries for 1 cached rows"):  # the columns
        runner.launch(StepPlan(1, cached_requests=cached_rows((1, 2)), num_draft_tokens=[1],
                               draft_token_ids=[5], draft_chained=[True, False]))
    # one row's fault: that row fails alone and is forgotten
    result = runner.execute(StepPlan(1, cached_requests=cached_rows((1, 1)), draft_chained=[True]))
    assert result.failed_req_ids == [1] and "chained verify row without drafts" in result.failed_errors[0]
    assert 1 not in runner.batch.requests
