"""The engine's one step loop: plan a step, send it, apply results — over any transport.

The engine-core process runs it over the gRPC step stream (executor_client.py), the in-process
benchmark over a ModelRunner, the scheduler tests over a fake executor. With depth 2 the loop
keeps one step queued at the executor: it sends step N+1 before it reads step N's result
(decode rows carry no token ids; the executor feeds its own last sample).

A step's outputs go out after the next plan (docs/scheduler.md, "The step's per-row work"):
applying a result does only what the next plan needs (tokens, stop and length rules, blocks);
the text of the rows that simply continue is decoded (Scheduler.fill_text) and the outputs
handed on once that plan is sent, so the executor is not kept waiting for the detokenizer.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import deque
from dataclasses import dataclass
from collections.abc import Callable
from typing import Protocol

from scheduler_svc.core.outputs import RequestOutput
from scheduler_svc.core.scheduler import Scheduler, StepResultError
from scheduler_svc.messages import RequestError
from step_protocol.domain import StepPlan, StepResult

log = logging.getLogger("llmserve.step_loop")
# What a step hands on: its requests' outputs and the requests it failed.
OutputSink = Callable[[list[RequestOutput], list[tuple[int, RequestError]]], None]


class Transport(Protocol):
    """Carries plans to an executor and its results back, in order."""

    async def send(self, plan: StepPlan) -> None: ...

    async def receive(self) -> StepResult: ...


@dataclass
class LoopTimings:
    """Where the loop's time went, in µs summed over its steps (a few integer additions a step)."""

    schedule_us: int = 0  # planning a step and handing it to the transport
    apply_us: int = 0  # applying results (tokens, stops, detokenization, outputs), all of it
    result_wait_us: int = 0  # waiting for a result with nothing else to do
    # The part of apply_us done after the next plan was sent (the deferred text and handing
    # the outputs on): off the critical path. The critical path's apply is the difference.
    deferred_us: int = 0


class StepLoop:
    """Drives a Scheduler over a Transport, at most `depth` steps in flight."""

    def __init__(self, scheduler: Scheduler, transport: Transport, depth: int, on_outputs: OutputSink,
                 on_result: Callable[[StepResult], None] | None = None,
                 on_plan: Callable[[StepPlan], None] | None = None,
                 timings: LoopTimings | None = None):
        self.scheduler = scheduler
        self.transport = transport
        self.depth = depth
        self.on_outputs = on_outputs
        self.on_result = on_result  # sees every result (timings) before it is applied
        self.on_plan = on_plan  # sees every plan (admissions, preemptions) before it is sent
        self.inflight: deque[StepPlan] = deque()
        self.num_planned = 0  # schedule() calls so far
        self.timings = timings if timings is not None else LoopTimings()
        self._unpublished: tuple[list[RequestOutput], list] | None = None  # applied, text to decode

    async def step(self) -> bool:
        """Does one thing: sends the next plan when one may go, else applies the oldest
        result. Returns False when there is nothing to do now (idle, or work that cannot be
        scheduled until something changes) and nothing is in flight."""
        timings, t0 = self.timings, time.perf_counter_ns()
        if self._can_plan():
            try:
                plan = self.scheduler.schedule()
                self.num_planned += 1
                if self.on_plan is not None:
                    self.on_plan(plan)
                if not plan.is_empty():
                    await self.transport.send(plan)
                    self.inflight.append(plan)
                    timings.schedule_us += (time.perf_counter_ns() - t0) // 1000
                    return True
            finally:  # sent (or failed, or nothing to send): the last step's outputs go out
                self._publish()
        if self.inflight:
            result = await self.transport.receive()
            t1 = time.perf_counter_ns()
            self._apply(result)
            timings.result_wait_us += (t1 - t0) // 1000
            timings.apply_us += (time.perf_counter_ns() - t1) // 1000
            if not self._can_plan():  # no plan follows at once: they go out now
                self._publish()
            return True
        return False

    def _can_plan(self) -> bool:
        return len(self.inflight) < self.depth and self.scheduler.has_work()

    def _publish(self) -> None:
        """Decodes the text of the last applied step's continuing rows and hands its outputs on."""
        if self._unpublished is None:
            return
        t0 = time.perf_counter_ns()
        (outputs, errors), self._unpublished = self._unpublished, None
        self.on_outputs(self.scheduler.fill_text(outputs), errors)
        us = (time.perf_counter_ns() - t0) // 1000
        self.timings.apply_us += us
        self.timings.deferred_us += us

    async def run_until_idle(self) -> None:
        while await self.step():
            pass

    def _apply(self, result: StepResult) -> None:
        plan = self.inflight.popleft()
        if result.step_id != plan.step_id:
            raise StepResultError(f"result for step {result.step_id}, expected {plan.step_id}")
        if self.on_result is not None:
            self.on_result(result)
        if not result.error:
            errors = self._fail_rows(result) if result.failed_req_ids else []
            outputs = self.scheduler.update_from_output(plan, result.sampled(), result, defer_text=True)
            self._unpublished = (outputs, errors)  # _publish: once the next plan is sent
            return
        log.error("step %d failed on the executor: %s", plan.step_id, result.error)
        error = RequestError("INTERNAL", f"the executor failed the step: {result.error}")
        for req_id in plan.scheduled_req_ids:
            self.scheduler.abort_request(req_id)  # before the update: their tokens are not coming
        self.scheduler.update_from_output(plan, {})
        self.on_outputs([], [(req_id, error) for req_id in plan.scheduled_req_ids])

    def _fail_rows(self, result: StepResult) -> list[tuple[int, RequestError]]:
        """Fails the rows the executor (or the transport) could not run, each alone: aborted
        before the update (their tokens are not coming; their KV is never shared: an aborted
        request caches no blocks), their blocks freed once no step in flight holds them. The
        executor's text goes to the log under an error id; the request's error carries the
        id only. A row of a request already finished (e.g. reported again by a step planned
        before the first report arrived) is ignored."""
        errors = []
        whys = result.failed_errors + [""] * (len(result.failed_req_ids) - len(result.failed_errors))
        for req_id, why in zip(result.failed_req_ids, whys):
            request = self.scheduler.requests.get(req_id)
            if request is None or request.is_finished:
                continue
            error_id = uuid.uuid4().hex[:12]
            log.error("step %d: the executor failed request %d alone (error id %s): %s",
                      result.step_id, req_id, error_id, why)
            self.scheduler.abort_request(req_id)
            errors.append((req_id, RequestError("INTERNAL", f"internal error (error id {error_id})")))
        return errors

