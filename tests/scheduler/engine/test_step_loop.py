"""The engine's one step loop over a scripted transport: overlap depth, failed steps, rows
that fail alone, and a result that answers the wrong plan."""

import asyncio
from collections import deque
from dataclasses import replace

import pytest

from scheduler_svc.core.scheduler import StepResultError
from scheduler_svc.engine.step_loop import StepLoop
from step_protocol.domain import StepPlan, StepResult
from step_protocol.plan_rows import without_rows
from tests.scheduler.sched_driver import (FakeExecutor, FakeTransport, collect, make_scheduler,
                                          reference_tokens, req)


class Scripted:
    """Answers each plan with what `answer(plan)` returns; records when plans were sent."""

    def __init__(self, answer):
        self.answer, self.sent, self.events = answer, [], []
        self._results: deque[StepResult] = deque()

    async def send(self, plan: StepPlan) -> None:
        self.sent.append(plan)
        self.events.append(("send", plan.step_id))
        self._results.append(self.answer(plan))

    async def receive(self) -> StepResult:
        result = self._results.popleft()
        self.events.append(("receive", result.step_id))
        return result


def _sample_all(plan: StepPlan) -> StepResult:
    ids = plan.scheduled_req_ids
    return StepResult(plan.step_id, ids, [3] * len(ids))


def _run(loop: StepLoop) -> None:
    asyncio.run(loop.run_until_idle())


@pytest.mark.parametrize("depth", [1, 2])
def test_depth_bounds_the_steps_in_flight(depth):
    transport, outputs = Scripted(_sample_all), []
    scheduler = make_scheduler()
    scheduler.add_request(req(0, [1, 2], max_tokens=4, ignore_eos=True))
    loop = StepLoop(scheduler, transport, depth, on_outputs=lambda o, e: outputs.extend(o))
    _run(loop)
    assert [o.new_token_ids for o in outputs] == [[3]] * 4 and outputs[-1].finished
    in_flight = peak = 0
    for kind, _ in transport.events:
        in_flight += 1 if kind == "send" else -1
        peak = max(peak, in_flight)
    assert peak == depth and not loop.inflight
    assert scheduler.num_free_blocks == scheduler.num_total_blocks


def test_a_failed_step_fails_its_requests_only():
    def answer(plan):
        if 0 in plan.scheduled_req_ids and plan.step_id > 0:
            return StepResult(plan.step_id, error="device fell over")
        return _sample_all(plan)

    scheduler, errors, outputs = make_scheduler(), [], []
    scheduler.add_request(req(0, [1, 2], max_tokens=5, ignore_eos=True))
    loop = StepLoop(scheduler, Scripted(answer), 1,
                    on_outputs=lambda o, e: (outputs.extend(o), errors.extend(e)))
    _run(loop)
    assert [(req_id, e.code) for req_id, e in errors] == [(0, "INTERNAL")]
    assert "device fell over" in errors[0][1].message
    assert not scheduler.requests and scheduler.num_free_blocks == scheduler.num_total_blocks


def test_a_result_for_another_step_is_a_protocol_error():
    scheduler = make_scheduler()
    scheduler.add_request(req(0, [1, 2], max_tokens=3))
    loop = StepLoop(scheduler, Scripted(lambda plan: StepResult(plan.step_id + 7)), 2,
                    on_outputs=lambda o, e: None)
    with pytest.raises(StepResultError, match="expected 0"):
        _run(loop)


class RefusingExecutor(FakeExecutor):
    """A FakeExecutor that refuses every row of the requests in `bad`, as the real one does:
    it never holds them, runs the rest of each plan and reports them in failed_req_ids."""

    def __init__(self, block_size: int, bad: set[int]):
        super().__init__(block_size)
        self.bad = bad

    def execute(self, plan: StepPlan) -> StepResult:
        failed = [r for r in plan.scheduled_req_ids if r in self.bad]
        kept = replace(without_rows(plan, failed),  # and no finish of a row it never held
                       finished_req_ids=[r for r in plan.finished_req_ids if r not in self.bad])
        result = super().execute(kept)
        result.failed_req_ids, result.failed_errors = failed, [f"new request {r}: temperature inf" for r in failed]
        return result


@pytest.mark.parametrize("depth", [1, 2])
def test_failed_rows_fail_only_those_requests_and_free_their_blocks(depth, caplog):
    prompts = {0: [1, 2, 3], 1: [4, 5, 6, 7, 8], 2: [9, 10]}
    scheduler, streams, errors = make_scheduler(), {}, []
    for req_id, prompt in prompts.items():
        scheduler.add_request(req(req_id, prompt, max_tokens=6, ignore_eos=True))
    loop = StepLoop(scheduler, FakeTransport(RefusingExecutor(4, {1})), depth,
                    on_outputs=lambda o, e: (collect(streams, o), errors.extend(e)))
    asyncio.run(loop.step())  # step 0 goes out: every request admitted
    blocks = {r: len(scheduler.requests[r].block_ids) for r in prompts}
    assert blocks == {0: 1, 1: 2, 2: 1}
    while not errors:
        asyncio.run(loop.step())
    # request 1 failed alone, INTERNAL with an error id; the executor's text is in the log only
    (req_id, error), = errors
    assert req_id == 1 and error.code == "INTERNAL" and error.message.startswith("internal error (error id ")
    error_id = error.message.split()[-1].rstrip(")")
    assert "temperature inf" not in error.message
    assert any(error_id in r.getMessage() and "temperature inf" in r.getMessage() for r in caplog.records)
    # its 2 blocks come back once no step in flight holds it (with depth 2, step 1 has it too;
    # the errors go out once the next plan is sent, so the others' blocks may have grown)
    if depth == 2:
        assert len(scheduler.requests[1].block_ids) == blocks[1] and scheduler.requests[1].is_finished
    else:
        assert 1 not in scheduler.requests
    asyncio.run(loop.run_until_idle())
    assert len(errors) == 1  # reported again by step 1 (planned ahead): already failed, ignored
    assert set(streams) == {0, 2} and not scheduler.requests  # every other row ran to its end
    for r in (0, 2):
        assert streams[r].token_ids == reference_tokens(prompts[r], 6)
    assert scheduler.num_free_blocks == scheduler.num_total_blocks
