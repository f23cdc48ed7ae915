"""The step loop: drives the scheduler core against the executor and fans outputs out to streams.

Everything here runs on the event loop thread, so the scheduler core needs no locks. With
overlap on, the loop keeps one step queued at the executor: it sends step N+1 before it reads
step N's result, so the GPU never waits for the gRPC hop (decode rows carry no token ids; the
executor feeds its own last sample).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from protos.llmserve.executor.v1 import executor_pb2 as epb
from scheduler_svc.executor_client import ExecutorClient, ExecutorUnavailable
from scheduler_svc.request import Request, SamplingParams
from scheduler_svc.scheduler import Scheduler
from scheduler_svc.scheduler_output import RequestOutput, SchedulerOutput
from scheduler_svc.wire import ExecutorInfo, sampled_from_pb

log = logging.getLogger("llmserve.engine")


class EngineError(Exception):
    """A request failed inside the engine; `code` names the gRPC status to answer with."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class StepStats:
    """Running totals the status RPC and the benchmarks read."""

    num_steps: int = 0
    prepare_us: int = 0
    forward_us: int = 0
    sample_us: int = 0
    num_graph_steps: int = 0


class Engine:
    """Owns the scheduler core, the executor client and one output queue per live request."""

    def __init__(self, client: ExecutorClient, make_scheduler: Callable[[ExecutorInfo], Scheduler],
                 *, overlap: bool, connect_timeout: float):
        self._client = client
        self._make_scheduler = make_scheduler
        self._depth = 2 if overlap else 1
        self._connect_timeout = connect_timeout
        self._ids = itertools.count(1)
        self._streams: dict[int, asyncio.Queue] = {}
        self._inflight: deque[SchedulerOutput] = deque()
        self._wake = asyncio.Event()
        self.stats = StepStats()
        self.info: ExecutorInfo | None = None
        self.scheduler: Scheduler | None = None

    async def start(self) -> ExecutorInfo:
        """Handshakes with the executor and sizes the scheduler from its answer."""
        self.info = await self._client.connect(self._connect_timeout)
        self.scheduler = self._make_scheduler(self.info)
        return self.info

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams
                       ) -> AsyncIterator[RequestOutput]:
        """Admits a request and yields its outputs; leaving early (cancellation) aborts it."""
        req_id = next(self._ids)
        queue: asyncio.Queue = asyncio.Queue()
        self._streams[req_id] = queue
        self.scheduler.add_request(Request(req_id, list(prompt_token_ids), params))
        self._wake.set()
        finished = False
        try:
            while not finished:
                item = _merge_ready(await queue.get(), queue)
                if isinstance(item, EngineError):
                    finished = True
                    raise item
                finished = item.finish_reason is not None
                yield item
        finally:
            del self._streams[req_id]
            if not finished:
                self.scheduler.abort_request(req_id)
                self._wake.set()

    async def run(self) -> None:
        """The step loop; runs until cancelled. Reconnects when the executor goes away."""
        while True:
            try:
                await self._step_loop()
            except ExecutorUnavailable as e:
                log.error("executor lost: %s; failing %d requests and reconnecting", e, len(self._streams))
                self._fail_all("UNAVAILABLE", f"the executor went away: {e}")
                await self.start()

    async def _step_loop(self) -> None:
        while True:
            if len(self._inflight) < self._depth and self.scheduler.has_work():
                out = self.scheduler.schedule()
                if _has_content(out):
                    await self._client.send(out)
                    self._inflight.append(out)
                    continue
            if self._inflight:
                await self._apply(await self._client.receive())
                continue
            self._wake.clear()
            if not self.scheduler.has_work() or not self._streams:
                await self._wake.wait()
            else:
                # Work exists but nothing could be scheduled: wait for a change, not a spin.
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=0.05)
                except asyncio.TimeoutError:
                    pass

    async def _apply(self, result: epb.StepResult) -> None:
        out = self._inflight.popleft()
        if result.step_id != out.step_id:
            raise ExecutorUnavailable(f"result for step {result.step_id}, expected {out.step_id}")
        self._record(result)
        if result.error:
            log.error("step %d failed on the executor: %s", out.step_id, result.error)
            ids = [r.req_id for r in out.new_requests] + [r.req_id for r in out.cached_requests]
            outputs = self.scheduler.update_from_output(out, {})
            self._dispatch(outputs)
            for req_id in ids:
                self._fail(req_id, "INTERNAL", f"the executor failed the step: {result.error}")
            return
        self._dispatch(self.scheduler.update_from_output(out, sampled_from_pb(result)))

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for o in outputs:
            queue = self._streams.get(o.req_id)
            if queue is not None:
                queue.put_nowait(o)

    def _fail(self, req_id: int, code: str, message: str) -> None:
        self.scheduler.abort_request(req_id)
        queue = self._streams.get(req_id)
        if queue is not None:
            queue.put_nowait(EngineError(code, message))

    def _fail_all(self, code: str, message: str) -> None:
        self._inflight.clear()
        for queue in self._streams.values():
            queue.put_nowait(EngineError(code, message))

    def _record(self, result: epb.StepResult) -> None:
        s = self.stats
        s.num_steps += 1
        s.prepare_us += result.prepare_us
        s.forward_us += result.forward_us
        s.sample_us += result.sample_us
        s.num_graph_steps += result.graph_size > 0


def _has_content(out: SchedulerOutput) -> bool:
    return bool(out.new_requests or out.cached_requests or out.finished_req_ids or out.preempted_req_ids)


def _merge_ready(item, queue: asyncio.Queue):
    """Folds outputs already queued behind `item` into one: when the stream falls behind the
    steps, the client gets fewer, larger messages instead of a growing backlog."""
    while not isinstance(item, EngineError) and item.finish_reason is None and not queue.empty():
        nxt = queue.get_nowait()
        if isinstance(nxt, EngineError):
            return nxt
        nxt.new_token_ids = item.new_token_ids + nxt.new_token_ids
        nxt.new_text = item.new_text + nxt.new_text
        item = nxt
    return item
