"""The scheduler core driving the executor's ModelRunner in one process (no gRPC), through the
engine's own step loop.

Plans still go through their protobuf form (built, serialized, parsed), so the difference
between this and the full system is the gRPC hop and the process split alone.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

from executor_svc.model_runner import ModelRunner
from protos.llmserve.executor.v1 import executor_pb2 as epb
from scheduler_svc.core.request import Request, SamplingParams
from scheduler_svc.core.scheduler import Scheduler, SchedulerCoreConfig
from scheduler_svc.core.tokenizer import Tokenizer
from scheduler_svc.engine.step_loop import StepLoop
from step_protocol import codec
from step_protocol.domain import StepPlan, StepResult


class InProcessTransport:
    """The step loop's transport to a ModelRunner in this process: send launches the step
    (no host sync), receive finishes the oldest one."""

    def __init__(self, runner: ModelRunner):
        self.runner = runner
        self._handles: deque = deque()

    async def send(self, plan: StepPlan) -> None:
        wire = epb.StepPlan.FromString(codec.plan_to_pb(plan).SerializeToString())
        self._handles.append(self.runner.launch(codec.plan_from_pb(wire)))

    async def receive(self) -> StepResult:
        return self.runner.finish(self._handles.popleft())


def make_scheduler(runner: ModelRunner) -> Scheduler:
    info = runner.info()
    core = SchedulerCoreConfig(
        num_blocks=info.num_blocks, block_size=info.block_size, max_num_seqs=info.max_num_seqs,
        max_num_batched_tokens=info.max_num_batched_tokens, max_model_len=info.max_model_len,
        long_prefill_token_threshold=2048, eos_token_ids=tuple(info.eos_token_ids))
    return Scheduler(core, Tokenizer.from_pretrained(info.model_path))


def run_workload(runner: ModelRunner, workload, *, temperature: float = 0.0, overlap: bool = True
                 ) -> tuple[int, float, float]:
    """Runs every request to completion; returns (output tokens, wall seconds, busy fraction)."""
    scheduler = make_scheduler(runner)
    for i, (prompt, out_len) in enumerate(workload):
        scheduler.add_request(Request(i + 1, list(prompt), SamplingParams(
            max_tokens=out_len, temperature=temperature, seed=i, ignore_eos=True)))
    totals = {"tokens": 0, "busy_us": 0}

    def on_outputs(outputs, errors) -> None:
        assert not errors, errors
        totals["tokens"] += sum(len(o.new_token_ids) for o in outputs)

    def on_result(result: StepResult) -> None:
        totals["busy_us"] += result.forward_us + result.sample_us

    loop = StepLoop(scheduler, InProcessTransport(runner), depth=2 if overlap else 1,
                    on_outputs=on_outputs, on_result=on_result)
    t0 = time.perf_counter()
    asyncio.run(loop.run_until_idle())
    wall = time.perf_counter() - t0
    return totals["tokens"], wall, totals["busy_us"] / 1e6 / wall
