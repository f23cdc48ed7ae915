"""The device process's two step threads (service/step_threads.py) over a real socketpair: step
N+1 launches while step N runs; results stay in plan order; at most 2 launched steps unanswered;
a plan that fails answers its error and the stream goes on; a reset waits for every launched step;
at the link's end every launched step is still answered."""

from __future__ import annotations

import threading
import time

import pytest

from executor_svc.service import link
from executor_svc.service.step_threads import DEPTH
from executor_svc.worker.host_device import HOST_SETS
from executor_svc.worker.plan_checks import PlanError
from protos.llmserve.executor.v1 import executor_pb2 as pb
from step_protocol import codec
from step_protocol.domain import StepResult
from tests.executor.conftest import make_runner
from tests.executor.service.step_driver import StepDriver


class FakeRunner:
    """launch() returns at once (PlanError for a step id in `bad`); finish() takes `gpu_s` (a step
    on the device). Logs the order of launches, finishes and resets."""

    def __init__(self, gpu_s: float = 0.05, bad=(), reset_error: str = ""):
        self.gpu_s, self.bad, self.reset_error = gpu_s, set(bad), reset_error
        self.log, self.lock, self.arrived = [], threading.Lock(), {}

    def _note(self, what, step):
        with self.lock:
            self.log.append((what, step))

    def launch(self, plan, arrived=None):
        self._note("launch", plan.step_id)
        self.arrived[plan.step_id] = (arrived, time.perf_counter())
        if plan.step_id in self.bad:
            raise PlanError(f"bad plan {plan.step_id}")
        return plan.step_id

    def finish(self, step):
        time.sleep(self.gpu_s)
        self._note("finish", step)
        return StepResult(step_id=step, req_ids=[step])

    def reset(self):
        self._note("reset", 0)
        if self.reset_error:
            raise RuntimeError(self.reset_error)


def plan(step_id: int) -> pb.StepPlan:
    return pb.StepPlan(step_id=step_id)


def _outstanding(log, bad=()):
    n = 0
    for what, step in log:
        if step not in bad and what in ("launch", "finish"):
            n += 1 if what == "launch" else -1
            yield n


@pytest.mark.parametrize("ahead", [1, 2])
def test_order_overlap_and_errors(ahead):
    """A client that keeps at most `ahead` plans unanswered (2: the overlapping scheduler)."""
    fake = FakeRunner(bad={3})
    steps = [1, 2, 3, 4, 5, 6]
    results, todo = [], list(steps)
    with StepDriver(fake) as device:
        for _ in range(ahead):
            device.send(plan(todo.pop(0)))
        while len(results) < len(steps):
            results.append(device.result())
            if todo:
                device.send(plan(todo.pop(0)))
    assert [r.step_id for r in results] == steps
    assert results[2].error == "PlanError: bad plan 3"
    assert [r.req_ids for r in results if not r.error] == [[s] for s in steps if s != 3]
    order = fake.log.index
    for a, b in ((1, 2), (4, 5), (5, 6)):  # was b launched while a still ran on the "device"?
        assert (order(("launch", b)) < order(("finish", a))) == (ahead == 2), (a, b, fake.log)
    assert [s for what, s in fake.log if what == "launch"] == steps  # launch order = plan order
    assert max(_outstanding(fake.log, fake.bad)) <= 2


def test_at_most_depth_launched_steps_unanswered():
    fake = FakeRunner(gpu_s=0.02)
    with StepDriver(fake) as device:
        for step in range(1, 13):  # a flood: every plan at once
            device.send(plan(step))
        results = [device.result() for _ in range(12)]
    assert [r.step_id for r in results] == list(range(1, 13))
    assert max(_outstanding(fake.log)) == DEPTH == HOST_SETS == 3


def test_a_reset_waits_for_every_launched_step_then_answers():
    fake = FakeRunner(gpu_s=0.1)
    with StepDriver(fake) as device:
        device.send(plan(1))
        device.send(plan(2))
        device.reset(7)
        device.send(plan(3))
        frames = [device.frame() for _ in range(4)]
    assert [(f.kind, f.tag) for f in frames] == [(link.RESULT, 1), (link.RESULT, 1), (link.RESET_DONE, 7),
                                                 (link.RESULT, 1)]
    assert frames[2].body == b""
    assert fake.log == [("launch", 1), ("launch", 2), ("finish", 1), ("finish", 2), ("reset", 0),
                        ("launch", 3), ("finish", 3)]


def test_a_failed_reset_answers_its_error():
    with StepDriver(FakeRunner(reset_error="boom")) as device:
        device.reset(3)
        frame = device.frame()
    assert (frame.kind, frame.tag, frame.body) == (link.RESET_DONE, 3, b"RuntimeError: boom")


def test_bytes_that_are_no_plan_fail_alone_and_results_carry_their_epoch():
    with StepDriver(FakeRunner(gpu_s=0)) as device:
        device.send(b"\xff\xff not a plan", epoch=4)
        device.send(plan(2), epoch=5)
        bad, good = device.frame(), device.frame()
    assert bad.tag == 4 and "DecodeError" in pb.StepResult.FromString(bad.body).error
    assert good.tag == 5 and pb.StepResult.FromString(good.body).req_ids == [2]


def test_the_link_ending_still_answers_what_was_launched():
    fake = FakeRunner(gpu_s=0.1)
    device = StepDriver(fake).__enter__()
    device.send(plan(1))
    device.send(plan(2))
    time.sleep(0.05)  # both read and launched
    device.end()
    assert [device.result().step_id for _ in range(2)] == [1, 2]
    device.close()  # both threads ended
    assert fake.log == [("launch", 1), ("launch", 2), ("finish", 1), ("finish", 2)]


def test_arrival_is_the_endpoints_clock_on_this_threads_scale():
    fake = FakeRunner(gpu_s=0)
    with StepDriver(fake) as device:
        device.send(plan(1), arrived_ns=time.monotonic_ns() - 50_000_000)  # read 50 ms ago
        device.result()
    arrived, launched = fake.arrived[1]
    assert 0.05 <= launched - arrived < 1.0


@pytest.fixture(scope="module")
def runner(model_dirs):
    return make_runner(model_dirs["tiny-qwen3"])


def _plans() -> list[pb.StepPlan]:
    greedy = pb.SamplerParams(temperature=0.0, top_p=1.0)
    sampled = pb.SamplerParams(temperature=0.8, top_k=40, top_p=0.9, seed=7)

    def new(req_id, prompt, params, block):
        return pb.NewRequest(req_id=req_id, token_ids=prompt, sampler_params=params,
                             block_ids=list(range(block, block + 4)), num_scheduled_tokens=len(prompt))

    def decode(*ids):
        n = len(ids)
        return pb.CachedRequests(req_ids=ids, num_scheduled_tokens=[1] * n, num_new_blocks=[0] * n)

    plans = [pb.StepPlan(step_id=1, new_requests=[new(1, list(range(5, 30)), greedy, 1),
                                                  new(2, [9, 8, 7, 6], sampled, 5)])]
    for step in range(2, 12):
        plan_ = pb.StepPlan(step_id=step, cached_requests=decode(1, 2, *([3] if step > 5 else [])))
        if step == 5:
            plan_.new_requests.append(new(3, [11, 12, 13, 14, 15, 16], greedy, 9))
        plans.append(plan_)
    plans.insert(4, pb.StepPlan(step_id=99, cached_requests=decode(1, 1)))  # refused, stream goes on
    plans.insert(5, pb.StepPlan(step_id=98, cached_requests=decode(42)))  # its one row fails alone
    plans.append(pb.StepPlan(step_id=12, finished_req_ids=[1, 2, 3]))
    return plans


def _key(r: StepResult):
    return r.step_id, r.req_ids, r.token_ids, r.error.split(":")[0], r.failed_req_ids


def test_the_runner_two_ahead_and_one_at_a_time_equal_sequential(runner):
    plans = _plans()
    runner.reset()
    expected = []
    for msg in plans:
        try:
            expected.append(runner.execute(codec.plan_from_pb(msg)))
        except PlanError as exc:
            expected.append(StepResult(step_id=msg.step_id, error=f"PlanError: {exc}"))
    runner.reset()
    assert expected[4].error and expected[5].failed_req_ids == [42] and expected[1].token_ids
    for ahead in (2, 1, 2):
        got = []
        with StepDriver(runner) as device:
            for i, msg in enumerate(plans):
                device.send(msg, arrived_ns=time.monotonic_ns() - (50_000_000 if i == 0 else 0))
                if i + 1 - len(got) == ahead:  # `ahead` plans unanswered: read the oldest
                    got.append(device.result())
            while len(got) < len(plans):
                got.append(device.result())
            device.reset()
            assert device.frame().kind == link.RESET_DONE
        assert [_key(r) for r in got] == [_key(r) for r in expected], ahead
        assert got[0].queued_us >= 50_000  # from the endpoint's arrival stamp
