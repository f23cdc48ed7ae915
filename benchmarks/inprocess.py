"""The scheduler core driving the executor's ModelRunner in one process (no gRPC).

Plans still go through their protobuf form (built, serialized, parsed), so the difference
between this and the full system is the gRPC hop and the process split alone.
"""

from __future__ import annotations

import time
from collections import deque

from executor_svc import wire as executor_wire
from executor_svc.model_runner import ModelRunner
from protos.llmserve.executor.v1 import executor_pb2 as epb
from scheduler_svc import wire as scheduler_wire
from scheduler_svc.request import Request, SamplingParams
from scheduler_svc.scheduler import Scheduler, SchedulerCoreConfig
from scheduler_svc.tokenizer import Tokenizer


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
    depth = 2 if overlap else 1
    inflight: deque = deque()
    tokens = busy_us = 0
    t0 = time.perf_counter()
    while scheduler.has_work() or inflight:
        if len(inflight) < depth and scheduler.has_work():
            out = scheduler.schedule()
            if out.new_requests or out.cached_requests or out.finished_req_ids or out.preempted_req_ids:
                wire_plan = epb.StepPlan.FromString(scheduler_wire.plan_to_pb(out).SerializeToString())
                inflight.append((out, runner.launch(executor_wire.plan_from_pb(wire_plan))))
                continue
        if not inflight:
            continue
        out, handle = inflight.popleft()
        result = runner.finish(handle)
        busy_us += result.forward_us + result.sample_us
        for o in scheduler.update_from_output(out, result.sampled()):
            tokens += len(o.new_token_ids)
    wall = time.perf_counter() - t0
    return tokens, wall, busy_us / 1e6 / wall
