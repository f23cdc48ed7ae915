"""A request whose own token raises while update_from_output applies it fails alone, in the core
itself: the other rows of that step are applied, it is finished (no output; its slot and blocks
go back, under the in-flight rule), and take_failed hands it over once with its exception."""

import pytest

from scheduler_svc.core.logprobs import StepResultError
from scheduler_svc.core.request import FinishReason
from scheduler_svc.core.scheduler import Scheduler
from step_protocol.domain import StepResult
from tests.scheduler.sched_driver import LetterDetokenizer, make_config, req


class Exploding(LetterDetokenizer):
    """Raises on its `at`-th token."""

    def __init__(self, at: int):
        self.at, self.n = at, 0

    def step(self, token_id: int) -> str:
        self.n += 1
        if self.n == self.at:
            raise RuntimeError("detokenizer exploded")
        return super().step(token_id)


def scheduler(failing: int, at: int) -> Scheduler:
    return Scheduler(make_config(), lambda r: Exploding(at) if r.req_id == failing else LetterDetokenizer(),
                     clock=lambda: 0.0)


def test_a_row_that_raises_fails_alone_and_the_step_goes_on():
    s = scheduler(failing=1, at=2)
    for i in range(3):
        s.add_request(req(i, [1, 2, 3], max_tokens=4))
    s.update_from_output(s.schedule(), {0: 5, 1: 5, 2: 5})
    assert s.take_failed() == {}
    free_before = s.num_free_blocks
    plan = s.schedule()
    outs = s.update_from_output(plan, {0: 6, 1: 6, 2: 6})  # request 1's second token raises
    assert [(o.req_id, o.new_token_ids) for o in outs] == [(0, [6]), (2, [6])]
    failed = s.take_failed()
    assert list(failed) == [1] and isinstance(failed[1], RuntimeError) and "exploded" in str(failed[1])
    assert s.take_failed() == {}  # handed over once
    assert 1 not in s.requests and s.num_free_blocks == free_before + 1  # its one block came back
    assert s.schedule().finished_req_ids == [1]  # the executor drops its row
    assert s.num_running == 2


def test_a_failed_request_with_a_step_in_flight_keeps_its_blocks_until_that_step_is_applied():
    s = scheduler(failing=0, at=1)
    s.add_request(req(0, [1, 2, 3], max_tokens=4))
    s.add_request(req(1, [4, 5, 6], max_tokens=4))
    first, second = s.schedule(), s.schedule()  # planned ahead: both requests in both steps
    outs = s.update_from_output(first, {0: 5, 1: 5})
    assert [o.req_id for o in outs] == [1] and list(s.take_failed()) == [0]
    request = s.requests[0]
    assert request.finish_reason is FinishReason.CANCELLED and request.block_ids  # step 2 may write them
    assert s.update_from_output(second, {0: 6, 1: 6})[0].req_id == 1  # its token of step 2: discarded
    assert 0 not in s.requests and s.num_free_blocks == s.num_total_blocks - 1


def test_a_step_without_the_logprobs_asked_for_is_no_one_request_fault():
    s = scheduler(failing=-1, at=0)
    s.add_request(req(0, [1, 2, 3], max_tokens=4, logprobs=1))
    plan = s.schedule()
    with pytest.raises(StepResultError, match="asked for logprobs"):
        s.update_from_output(plan, {0: 5}, StepResult(plan.step_id, [0], [5]))
    assert s.take_failed() == {}
