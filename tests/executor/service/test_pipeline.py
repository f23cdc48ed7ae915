"""Pipelined Execute: step N+1 launches while step N runs; results stay in plan order; plans sent
two ahead or one at a time give the same results and never hang."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from executor_svc.service.pipeline import StepPipeline
from executor_svc.service.servicer import ExecutorServicer
from executor_svc.worker.plan_checks import PlanError
from protos.llmserve.executor.v1 import executor_pb2 as pb
from protos.llmserve.executor.v1 import executor_pb2_grpc as pb_grpc
from step_protocol import codec
from step_protocol.domain import StepResult
from tests.executor.conftest import make_runner

TIMEOUT = 30


class FakeRunner:
    """launch() returns at once; finish() takes `gpu_s` (a step on the device). Logs the order."""

    def __init__(self, gpu_s: float = 0.05):
        self.gpu_s, self.log, self.lock = gpu_s, [], threading.Lock()

    def _note(self, what, step):
        with self.lock:
            self.log.append((what, step))

    def launch(self, step):
        self._note("launch", step)
        if step < 0:
            raise ValueError(f"bad plan {step}")
        return step

    def finish(self, step):
        time.sleep(self.gpu_s)
        self._note("finish", step)
        return f"out{step}"


async def _drive(pipeline: StepPipeline, steps: list[int], ahead: int) -> list:
    """A client that keeps at most `ahead` plans unanswered (2: the overlapping scheduler)."""
    queue: asyncio.Queue = asyncio.Queue()

    async def plans():
        while (item := await queue.get()) is not None:
            yield item

    results, todo = [], list(steps)
    for _ in range(min(ahead, len(todo))):
        queue.put_nowait(todo.pop(0))
    async for item, result in pipeline.run(plans()):
        results.append((item, result if isinstance(result, str) else repr(result)))
        if todo:
            queue.put_nowait(todo.pop(0))
        elif len(results) == len(steps):
            queue.put_nowait(None)
    return results


@pytest.mark.parametrize("ahead", [1, 2])
def test_pipeline_order_overlap_and_errors(ahead):
    fake = FakeRunner()
    steps = [1, 2, -3, 4, 5, 6]
    with ThreadPoolExecutor(1) as worker, ThreadPoolExecutor(1) as waiter:
        pipeline = StepPipeline(fake.launch, fake.finish, worker, waiter)
        results = asyncio.run(asyncio.wait_for(_drive(pipeline, steps, ahead), TIMEOUT))
    assert [r[0] for r in results] == steps
    assert results[2][1] == "ValueError('bad plan -3')"
    assert [r[1] for r in results if r[0] > 0] == [f"out{s}" for s in steps if s > 0]
    order = fake.log.index
    for a, b in ((1, 2), (4, 5), (5, 6)):  # was b launched while a still ran on the "device"?
        assert (order(("launch", b)) < order(("finish", a))) == (ahead == 2), (a, b, fake.log)
    launched = [s for what, s in fake.log if what == "launch"]
    assert launched == steps  # launch order = plan order
    assert max(_outstanding(fake.log)) <= 2


def _outstanding(log):
    n = 0
    for what, step in log:
        if step > 0:
            n += 1 if what == "launch" else -1
            yield n


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
        plan = pb.StepPlan(step_id=step, cached_requests=decode(1, 2, *([3] if step > 5 else [])))
        if step == 5:
            plan.new_requests.append(new(3, [11, 12, 13, 14, 15, 16], greedy, 9))
        plans.append(plan)
    plans.insert(4, pb.StepPlan(step_id=99, cached_requests=decode(1, 1)))  # refused, stream goes on
    plans.insert(5, pb.StepPlan(step_id=98, cached_requests=decode(42)))  # its one row fails alone
    plans.append(pb.StepPlan(step_id=12, finished_req_ids=[1, 2, 3]))
    return plans


def _key(r: pb.StepResult):
    return r.step_id, list(r.req_ids), list(r.token_ids), r.error.split(":")[0], list(r.failed_req_ids)


async def _over_grpc(runner, plans, ahead: int) -> list[pb.StepResult]:
    worker = ThreadPoolExecutor(1)
    server = grpc.aio.server()
    pb_grpc.add_ExecutorServicer_to_server(ExecutorServicer(runner, worker), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.ExecutorStub(channel)
            call = stub.Execute()
            results = []
            for i, plan in enumerate(plans):
                await call.write(plan)
                if i + 1 - len(results) == ahead:  # `ahead` plans unanswered: read the oldest
                    results.append(await call.read())
            await call.done_writing()
            while len(results) < len(plans):
                results.append(await call.read())
            assert await call.read() == grpc.aio.EOF
            await stub.Reset(pb.ResetRequest())
            return results
    finally:
        await server.stop(None)
        worker.shutdown()


def test_execute_two_ahead_and_one_at_a_time_equal_sequential(runner):
    plans = _plans()
    runner.reset()
    expected = []
    for msg in plans:
        try:
            expected.append(codec.result_to_pb(runner.execute(codec.plan_from_pb(msg))))
        except PlanError as exc:
            expected.append(codec.result_to_pb(StepResult(step_id=msg.step_id, error=f"PlanError: {exc}")))
    runner.reset()
    assert expected[4].error and list(expected[5].failed_req_ids) == [42] and expected[1].token_ids
    for ahead in (2, 1, 2):
        got = asyncio.run(asyncio.wait_for(_over_grpc(runner, plans, ahead), TIMEOUT))
        assert [_key(r) for r in got] == [_key(r) for r in expected], ahead


def test_plans_are_read_ahead_only_up_to_the_bound():
    """A peer that sends plans far faster than they run: the pipeline reads at most `depth`
    launched + MAX_READ_AHEAD queued (+ the one being handed over) before the first result."""
    from executor_svc.service.pipeline import MAX_READ_AHEAD

    pulled = []

    async def flood():
        for step in range(100):
            pulled.append(step)
            yield step

    async def first_result():
        pool, waiter = ThreadPoolExecutor(1), ThreadPoolExecutor(1)
        pipeline = StepPipeline(FakeRunner(gpu_s=0.3).launch, FakeRunner(gpu_s=0.3).finish, pool, waiter, depth=2)
        gen = pipeline.run(flood())
        item, _ = await asyncio.wait_for(gen.__anext__(), TIMEOUT)
        read = len(pulled)
        await gen.aclose()
        pool.shutdown()
        waiter.shutdown()
        return item, read

    item, read = asyncio.run(first_result())
    assert item == 0
    assert 2 + MAX_READ_AHEAD <= read <= 2 + MAX_READ_AHEAD + 1, read  # + the one waiting to be queued
