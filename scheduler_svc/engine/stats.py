"""The engine core's own figures: executor step times, preemptions, first-scheduled times of
requests (for the API process's queue and prefill time metrics), and the periodic stats line.

Everything here is a few integer additions per step; the stats line is written by a timer task
(StatsLogger.run), never from the step path.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time

from scheduler_svc.core.outputs import RequestOutput
from scheduler_svc.engine.step_loop import LoopTimings
from scheduler_svc.messages import CoreStats
from step_protocol.domain import StepPlan, StepResult

log = logging.getLogger("llmserve.engine_core")
# Upper bounds (seconds) of the executor step time histogram (llmserve:executor_step_time_seconds).
STEP_TIME_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05,
                     0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class EngineStats:
    """Counts what the step loop sees into a CoreStats (shared with the publisher)."""

    def __init__(self, stats: CoreStats):
        self.stats = stats
        self._step_counts = [0] * (len(STEP_TIME_BUCKETS) + 1)
        self.scheduled: list[tuple[int, float]] = []  # since the last message to the API process
        # For the stats line: tokens since start (prompts counted at their first token).
        self.num_prompt_tokens = 0
        self.num_generation_tokens = 0
        self.loop_timings = LoopTimings()  # the step loop adds its own times here

    def on_plan(self, plan: StepPlan) -> None:
        if plan.new_requests:
            now = time.monotonic()
            self.scheduled.extend((r.req_id, now) for r in plan.new_requests)
        self.stats.num_preemptions += len(plan.preempted_req_ids)

    def on_result(self, result: StepResult) -> None:
        s = self.stats
        s.num_steps += 1
        s.prepare_us += result.prepare_us
        s.forward_us += result.forward_us
        s.sample_us += result.sample_us
        s.num_graph_steps += result.graph_size > 0
        s.executor_queued_us += result.queued_us
        s.executor_launch_us += result.launch_us
        s.executor_launch_cpu_us += result.launch_cpu_us
        s.device_idle_us += result.device_idle_us
        seconds = (result.prepare_us + result.forward_us + result.sample_us) / 1e6
        self._step_counts[bisect.bisect_left(STEP_TIME_BUCKETS, seconds)] += 1

    def on_outputs(self, outputs: list[RequestOutput]) -> None:
        for o in outputs:
            n = len(o.new_token_ids)
            self.num_generation_tokens += n
            if n and o.num_output_tokens == n:  # the request's first token: its prompt is done
                self.num_prompt_tokens += o.num_prompt_tokens

    def take_scheduled(self) -> list[tuple[int, float]]:
        s, t = self.stats, self.loop_timings
        s.step_time_counts = tuple(self._step_counts)
        s.schedule_us, s.apply_us, s.result_wait_us = t.schedule_us, t.apply_us, t.result_wait_us
        s.apply_deferred_us = t.deferred_us
        scheduled, self.scheduled = self.scheduled, []
        return scheduled


def spec_decode_text(num_drafts: int, num_draft_tokens: int, num_accepted: int) -> str:
    """The speculative decoding part of the stats line (vLLM's figures); "" without drafts.
    Mean acceptance length: tokens a verify row produced on average (its accepted drafts + 1)."""
    if not num_drafts:
        return ""
    return (f", Spec decode: mean acceptance length {1 + num_accepted / num_drafts:.2f}, "
            f"draft acceptance rate {100 * num_accepted / max(num_draft_tokens, 1):.1f}%")


class StatsLogger:
    """Writes vLLM's periodic stats line every `interval` seconds while there was activity."""

    def __init__(self, engine_stats: EngineStats, interval: float):
        self._es = engine_stats
        self.interval = interval
        self._last = self._snapshot()
        self._last_time = time.monotonic()

    def _snapshot(self) -> tuple[int, ...]:
        s, es = self._es.stats, self._es
        return (es.num_prompt_tokens, es.num_generation_tokens, s.prefix_cache_queries,
                s.prefix_cache_hits, s.num_steps, s.spec_decode_num_drafts,
                s.spec_decode_num_draft_tokens, s.spec_decode_num_accepted_tokens)

    def line(self) -> str | None:
        """The stats line since the last call, or None when nothing ran meanwhile."""
        now, snap = time.monotonic(), self._snapshot()
        dt = max(now - self._last_time, 1e-9)
        d_prompt, d_gen, d_queries, d_hits, d_steps, d_drafts, d_draft_tokens, d_accepted = (
            a - b for a, b in zip(snap, self._last))
        self._last, self._last_time = snap, now
        s = self._es.stats
        if not (d_steps or d_prompt or d_gen or s.num_running or s.num_waiting):
            return None
        kv = 1 - s.num_free_blocks / s.num_total_blocks if s.num_total_blocks else 0.0
        hit_rate = d_hits / d_queries if d_queries else 0.0
        return (f"Avg prompt throughput: {d_prompt / dt:.1f} tokens/s, "
                f"Avg generation throughput: {d_gen / dt:.1f} tokens/s, "
                f"Running: {s.num_running} reqs, Waiting: {s.num_waiting} reqs, "
                f"KV cache usage: {100 * kv:.1f}%, Prefix cache hit rate: {100 * hit_rate:.1f}%"
                + spec_decode_text(d_drafts, d_draft_tokens, d_accepted))

    async def run(self) -> None:
        if self.interval <= 0:
            return
        while True:
            await asyncio.sleep(self.interval)
            text = self.line()
            if text is not None:
                log.info("%s", text)
