"""A constrained step's masked sampling is enqueued after its launch (model_runner._flush): by
the next launch, at its start, before that plan changes any row, or by the step's own finish
when no launch follows, on the finish thread, as the executor's step threads call it. Either way
the tokens are those of running the steps one at a time (CPU)."""

from __future__ import annotations

import threading
import time

import pytest

from llmserve.structured import regex, to_grammar
from step_protocol.domain import NewRequestData, SamplerParams, StepPlan
from tests.executor.conftest import decode_rows, make_runner
from tests.executor.service.step_driver import StepDriver

PROMPTS = {1: [5, 17, 99, 3, 250, 8], 2: [7, 11, 13, 19, 23], 3: [40, 41, 42]}
LONG = to_grammar(regex(r"[a-z ]{60}", "regex"))  # never ends within these steps


@pytest.fixture(scope="module")
def runner(model_dirs):
    return make_runner(model_dirs["tiny-llama"])


def _params(req_id: int) -> SamplerParams:
    if req_id == 2:  # unconstrained, beside the constrained ones
        return SamplerParams(temperature=1.0, seed=20)
    return SamplerParams(temperature=1.0, seed=req_id, grammar=LONG)


def _plans(req_ids: list[int], steps: int) -> list[StepPlan]:
    first = StepPlan(0, [NewRequestData(r, PROMPTS[r], _params(r), [4 * r + i for i in range(1, 5)], 0,
                                        len(PROMPTS[r])) for r in req_ids])
    return [first] + [StepPlan(s, cached_requests=decode_rows(req_ids)) for s in range(1, steps)]


def _tokens(results) -> dict[int, list[int]]:
    tokens: dict[int, list[int]] = {}
    for result in results:
        assert not result.failed_req_ids, result.failed_errors
        for req_id, token in result.sampled().items():
            tokens.setdefault(req_id, []).append(token)
    return tokens


def _one_at_a_time(runner, req_ids, steps):
    runner.reset()
    try:
        return _tokens([runner.execute(plan) for plan in _plans(req_ids, steps)])
    finally:
        runner.reset()


def test_the_next_launch_enqueues_it_and_the_last_steps_finish_does(runner):
    reference = _one_at_a_time(runner, [1, 2], 6)
    runner.reset()
    plans = _plans([1, 2], 6)
    results = [runner.execute(plans[0])]
    handles = [runner.launch(plans[1])]
    assert handles[0].deferred is not None and handles[0].sampled is None  # not sampled yet
    for plan in plans[2:]:
        handles.append(runner.launch(plan))
        assert handles[-2].deferred is None and handles[-2].sampled is not None  # this launch did it
        results.append(runner.finish(handles.pop(0)))
    assert handles[0].deferred is not None
    results.append(runner.finish(handles.pop(0)))  # no launch after it: its finish samples
    runner.reset()
    assert _tokens(results) == reference


def test_an_unconstrained_step_samples_in_its_launch(runner):
    runner.reset()
    plans = _plans([2], 3)
    runner.execute(plans[0])
    handle = runner.launch(plans[1])
    assert handle.deferred is None and handle.sampled is not None
    runner.finish(handle)
    runner.reset()


@pytest.mark.parametrize("req_ids", [[1], [1, 2, 3]])
def test_the_executors_pipeline_gives_the_tokens_of_one_step_at_a_time(runner, req_ids):
    """The step threads as the executor's device process runs them: launches on one thread,
    finishes on another as soon as each launch returns, so a step's finish and the next launch
    race to enqueue its sampling; the plans arrive late now and then (a finish waits for no launch)."""
    steps = 12
    reference = _one_at_a_time(runner, req_ids, steps)

    def send(device):
        for i, plan in enumerate(_plans(req_ids, steps)):
            if i % 4 == 3:
                time.sleep(0.05)  # no launch for a while: the step's finish samples it
            device.send(plan)

    runner.reset()
    for _ in range(3):
        with StepDriver(runner) as device:
            sender = threading.Thread(target=send, args=(device,))
            sender.start()
            results = [device.result() for _ in range(steps)]
            sender.join()
        runner.reset()
        for r in results:
            assert not r.error, r.error
        assert _tokens(results) == reference
