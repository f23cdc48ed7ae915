"""The text of continuing rows decoded after the update (core/deferred_text.py): the same
outputs as decoding during the update, the rows a rule may end decoded at once, a detokenizer
that raises failing its request alone, and the step loop handing a step's outputs on only
after the next plan went out."""

import asyncio

import pytest

from scheduler_svc.core.request import FinishReason
from scheduler_svc.core.scheduler import Scheduler
from scheduler_svc.engine.step_loop import StepLoop
from tests.scheduler.core.test_step_ahead import scenario
from tests.scheduler.sched_driver import (EOS, FakeExecutor, FakeTransport, LetterDetokenizer,
                                          letter, make_config, make_scheduler, reference_tokens, req)


def drive(scheduler: Scheduler, arrivals: dict, defer: bool) -> list[list]:
    """Every step's outputs, one step at a time; with defer, fill_text after each update."""
    executor, steps = FakeExecutor(scheduler.config.block_size), []
    for step in range(400):
        for request in arrivals.get(step, []):
            scheduler.add_request(request)
        if not scheduler.has_work() and step > max(arrivals):
            return steps
        plan = scheduler.schedule()
        if not plan.has_rows():
            continue
        result = executor.execute(plan)
        executor.applied(plan.step_id)
        outputs = scheduler.update_from_output(plan, result.sampled(), result, defer_text=defer)
        steps.append(scheduler.fill_text(outputs) if defer else outputs)
    raise AssertionError("did not finish")


def arrivals() -> dict:
    """test_step_ahead's scenario (every stop rule, a full context) and logprobs, min_tokens."""
    out = scenario()
    out.setdefault(2, []).append(req(200, [5, 6, 7], max_tokens=9, logprobs=2))
    out.setdefault(4, []).append(req(201, [8, 9], max_tokens=7, min_tokens=5, prompt_logprobs=1))
    return out


@pytest.mark.parametrize("config", [{}, dict(num_blocks=13, block_size=4)])  # roomy; preempting
def test_deferred_text_gives_the_outputs_of_text_decoded_in_the_update(config):
    reference = drive(make_scheduler(max_model_len=32, **config), arrivals(), defer=False)
    deferred = drive(make_scheduler(max_model_len=32, **config), arrivals(), defer=True)
    assert deferred == reference
    reasons = {o.finish_reason for outs in reference for o in outs}
    assert reasons >= {FinishReason.LENGTH, FinishReason.EOS, FinishReason.STOP}


def test_only_rows_that_simply_continue_wait_for_their_text():
    s = make_scheduler()
    prompt = [1, 2, 3]
    tokens = reference_tokens(prompt, 3)
    s.add_request(req(0, prompt, max_tokens=10, ignore_eos=True))  # continues
    s.add_request(req(1, prompt, max_tokens=1, ignore_eos=True))  # its last token
    s.add_request(req(2, prompt, max_tokens=10, ignore_eos=True, stop=("??",)))  # a stop string
    s.add_request(req(3, prompt, max_tokens=10, ignore_eos=True, logprobs=0))
    s.add_request(req(4, prompt, max_tokens=10, stop_token_ids=(tokens[0],)))  # a stop token
    plan = s.schedule()
    sampled = {r: tokens[0] for r in plan.scheduled_req_ids}
    lp = FakeExecutor(4).execute(plan)  # (its logprobs for request 3)
    outs = s.update_from_output(plan, sampled, lp, defer_text=True)
    text = letter(tokens[0])
    assert [(o.req_id, o.new_text, o.finish_reason) for o in outs] == [
        (0, "", None), (1, text, FinishReason.LENGTH), (2, text, None), (3, text, None),
        (4, "", FinishReason.STOP)]
    with pytest.raises(RuntimeError, match="fill_text"):
        s.update_from_output(s.schedule(), {})
    assert [o.new_text for o in s.fill_text(outs)] == [text, text, text, text, ""]
    assert s.fill_text(outs) == outs  # nothing left to decode: the same outputs


class Exploding(LetterDetokenizer):
    def step(self, token_id: int) -> str:
        raise RuntimeError("detokenizer exploded")


def test_a_detokenizer_that_raises_while_the_text_is_filled_fails_its_request_alone():
    s = Scheduler(make_config(), lambda r: Exploding() if r.req_id == 1 else LetterDetokenizer(),
                  clock=lambda: 0.0)
    for i in range(3):
        s.add_request(req(i, [1, 2, 3], max_tokens=4, ignore_eos=True))
    plan = s.schedule()
    outs = s.update_from_output(plan, {0: 5, 1: 5, 2: 5}, defer_text=True)
    assert [o.req_id for o in outs] == [0, 1, 2] and s.take_failed() == {}
    outs = s.fill_text(outs)
    assert [(o.req_id, o.new_text) for o in outs] == [(0, letter(5)), (2, letter(5))]
    failed = s.take_failed()
    assert list(failed) == [1] and "exploded" in str(failed[1])
    assert 1 not in s.requests and s.schedule().finished_req_ids == [1]
    assert s.num_free_blocks == s.num_total_blocks - 2  # requests 0 and 2 hold a block each


def test_the_step_loop_hands_a_steps_outputs_on_after_the_next_plan_is_sent():
    events = []

    class Recording(FakeTransport):
        async def send(self, plan):
            events.append(("sent", plan.step_id))
            await super().send(plan)

    s = make_scheduler()
    s.add_request(req(0, [1, 2, 3], max_tokens=3, ignore_eos=True))
    loop = StepLoop(s, Recording(FakeExecutor(4)), 2,
                    on_outputs=lambda outs, errors: events.append(
                        ("out", [(o.req_id, o.new_token_ids, o.new_text) for o in outs])))
    asyncio.run(loop.run_until_idle())
    tokens = reference_tokens([1, 2, 3], 3)
    out = [("out", [(0, [t], letter(t))]) for t in tokens]
    # step 3's plan was empty (the last token in flight), step 4 only reports the finish
    assert events == [("sent", 0), ("sent", 1), ("sent", 2), out[0], out[1], ("sent", 4), out[2],
                      ("out", [])]
    assert loop.timings.deferred_us <= loop.timings.apply_us
    assert EOS not in tokens
