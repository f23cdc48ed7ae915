"""The engine's one step loop over a scripted transport: overlap depth, failed steps, and a
result that answers the wrong plan."""

import asyncio
from collections import deque

import pytest

from scheduler_svc.core.scheduler import StepResultError
from scheduler_svc.engine.step_loop import StepLoop
from step_protocol.domain import StepPlan, StepResult
from tests.scheduler.sched_driver import make_scheduler, req


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
