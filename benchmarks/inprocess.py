"""The scheduler core driving the executor's ModelRunner in one process (no gRPC), through the
engine's own step loop.

Plans still go through their protobuf form (built, serialized, parsed), so the difference
between this and the full system is the gRPC hop and the process split alone.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

from executor_svc.worker.model_runner import ModelRunner
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


def run_workload(runner: ModelRunner, workload, *, temperature: float = 0.0, overlap: bool = True,
                 **params) -> tuple[int, float, float]:
    """Runs every request to completion; returns (output tokens, wall seconds, busy fraction).
    params: more SamplingParams fields of every request (e.g. logprobs=5)."""
    requests = [Request(i + 1, list(prompt), SamplingParams(
        max_tokens=out_len, temperature=temperature, seed=i, ignore_eos=True, **params))
        for i, (prompt, out_len) in enumerate(workload)]
    tokens, wall, busy_us = _run(runner, requests, overlap)
    return sum(len(t) for t in tokens.values()), wall, busy_us / 1e6 / wall


def run_requests(runner: ModelRunner, requests: list[Request], overlap: bool = True
                 ) -> tuple[dict[int, list[int]], float, float]:
    """Runs these requests to completion: (token ids by request, wall seconds, busy fraction)."""
    tokens, wall, busy_us = _run(runner, requests, overlap)
    return tokens, wall, busy_us / 1e6 / wall


def greedy_tokens(runner: ModelRunner, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Greedy outputs of the prompts, batched together (EOS ends a request)."""
    requests = [Request(i + 1, list(p), SamplingParams(max_tokens=max_tokens, temperature=0.0))
                for i, p in enumerate(prompts)]
    tokens, _, _ = _run(runner, requests, overlap=True)
    return [tokens[i + 1] for i in range(len(prompts))]


def _run(runner: ModelRunner, requests: list[Request], overlap: bool
         ) -> tuple[dict[int, list[int]], float, int]:
    """Runs the requests through the engine's step loop: (token ids by request, wall s, busy µs)."""
    scheduler = make_scheduler(runner)
    for request in requests:
        scheduler.add_request(request)
    tokens: dict[int, list[int]] = {r.req_id: [] for r in requests}
    busy = [0]

    def on_outputs(outputs, errors) -> None:
        assert not errors, errors
        for o in outputs:
            tokens[o.req_id] += o.new_token_ids

    def on_result(result: StepResult) -> None:
        busy[0] += result.forward_us + result.sample_us

    loop = StepLoop(scheduler, InProcessTransport(runner), depth=2 if overlap else 1,
                    on_outputs=on_outputs, on_result=on_result)
    t0 = time.perf_counter()
    asyncio.run(loop.run_until_idle())
    return tokens, time.perf_counter() - t0, busy[0]
