"""A bad row fails alone: the executor drops a row it refuses (or cannot set up), runs the
rest of the plan and reports the row in StepResult.failed_req_ids; every other row's tokens
are exactly those of the same steps without the bad row."""

from __future__ import annotations

import math

import pytest

from step_protocol.domain import CachedRequestData, NewRequestData, SamplerParams, StepPlan
from tests.executor.conftest import cached_rows, decode_rows, make_runner

PROMPT_A = list(range(3, 40))
PROMPT_B = [7, 99, 12, 300, 41, 5, 6, 8, 250, 11]
PROMPT_C = [60 + i for i in range(21)]
SEEDED = SamplerParams(temperature=0.8, top_k=50, top_p=0.9, seed=3)


@pytest.fixture(scope="module")
def runner(model_dirs):
    return make_runner(model_dirs["tiny-llama"])


def _busy(runner, bad: list[NewRequestData] = (), ahead: bool = False, num_steps: int = 5):
    """A greedy and a seeded request decoding, a third admitted at step 2, for num_steps
    steps; `bad` rows join step 2 (ahead: and step 3 has them as decode rows, as a scheduler
    that planned step 3 before step 2's result would). Returns each step's result."""
    runner.reset()
    new_a = NewRequestData(1, PROMPT_A, SamplerParams(), [1, 2, 3, 4], 0, len(PROMPT_A))
    new_b = NewRequestData(2, PROMPT_B, SEEDED, [5, 6], 0, len(PROMPT_B))
    new_c = NewRequestData(3, PROMPT_C, SamplerParams(), [7, 8], 0, len(PROMPT_C))
    results = [runner.execute(StepPlan(1, [new_a, new_b]))]
    results.append(runner.execute(StepPlan(2, [*bad, new_c], decode_rows([1, 2]))))
    for step in range(3, num_steps + 1):
        extra = [r.req_id for r in bad] if ahead and step == 3 else []
        results.append(runner.execute(StepPlan(step, cached_requests=decode_rows([1, 2, 3, *extra]))))
    return results


def _tokens(results) -> list[dict[int, int]]:
    return [r.sampled() for r in results]


@pytest.mark.parametrize("ahead", [False, True])
def test_a_refused_new_row_in_a_busy_batch_fails_alone(runner, ahead):
    reference = _tokens(_busy(runner))
    free_rows = len(runner.batch.free_rows)
    bad = NewRequestData(16, PROMPT_B, SamplerParams(temperature=math.inf), [20], 0, len(PROMPT_B))
    results = _busy(runner, [bad], ahead)
    assert _tokens(results) == reference  # token-exact: the bad row changed nothing of the others
    assert results[1].failed_req_ids == [16] and "new request 16: temperature inf" in results[1].failed_errors[0]
    # planned ahead, it is a decode row of a request the executor never added: it fails again
    assert results[2].failed_req_ids == ([16] if ahead else [])
    assert all(not r.failed_req_ids for r in results[3:]) and not any(r.error for r in results)
    assert 16 not in runner.batch.requests and len(runner.batch.free_rows) == free_rows


def test_a_row_whose_setup_raises_fails_alone(runner, monkeypatch):
    reference = _tokens(_busy(runner))
    free_rows = len(runner.batch.free_rows)
    sampling_add = runner.sampler.add_request

    def add(row, new):  # request 16's sampling state cannot be set up (after its row was taken)
        if new.req_id == 16:
            raise RuntimeError("device out of memory")
        return sampling_add(row, new)

    monkeypatch.setattr(runner.sampler, "add_request", add)
    good_params = SamplerParams(temperature=0.5, seed=9, presence_penalty=0.5)
    bad = NewRequestData(16, PROMPT_B, good_params, [20], 0, len(PROMPT_B))
    results = _busy(runner, [bad], ahead=True)
    assert _tokens(results) == reference
    assert results[1].failed_req_ids == [16] and "RuntimeError: device out of memory" in results[1].failed_errors[0]
    assert 16 not in runner.batch.requests and len(runner.batch.free_rows) == free_rows
    assert not runner.batch.block_table[[s is None for s in runner.batch.states]].any()  # its blocks gone too


def test_a_refused_cached_row_is_forgotten_and_the_others_run(runner):
    """Step 3 asks request 3 for 2 tokens past what it knows: it alone fails and is forgotten
    (as if finished); requests 1 and 2 give the tokens of steps that finished 3 instead."""
    _busy(runner, num_steps=2)
    finished = [runner.execute(StepPlan(3, cached_requests=decode_rows([1, 2]), finished_req_ids=[3]))]
    finished += [runner.execute(StepPlan(step, cached_requests=decode_rows([1, 2]))) for step in (4, 5)]
    _busy(runner, num_steps=2)
    got = [runner.execute(StepPlan(3, cached_requests=cached_rows((1, 1), (2, 1), (3, 2))))]
    assert got[0].failed_req_ids == [3] and "cached request 3: num_scheduled_tokens 2" in got[0].failed_errors[0]
    assert 3 not in runner.batch.requests
    got += [runner.execute(StepPlan(step, cached_requests=decode_rows([1, 2]))) for step in (4, 5)]
    assert _tokens(got) == _tokens(finished)  # token-exact
    # the next plan's finish of request 3 (the scheduler's abort) is ignored: it is gone already
    assert not runner.execute(StepPlan(6, cached_requests=CachedRequestData(), finished_req_ids=[3])).error
