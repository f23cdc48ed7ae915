"""The engine: the scheduler core and the executor stream on their own thread, fanned out to
the API's request streams.

Two event loops, two jobs. The *core loop* (a dedicated thread) owns the scheduler core and the
executor stream: it plans, sends, applies results and never waits behind client streams. The
*API loop* (the gRPC server's) owns one output queue per request and streams to clients.
They meet in three thread-safe hand-offs: add a request, abort a request (API -> core), and
one batch of outputs per step (core -> API). With the two on one loop, hundreds of client
streams delayed the step loop and left the GPU idle between steps.

With overlap on, the core keeps one step queued at the executor: it sends step N+1 before it
reads step N's result (decode rows carry no token ids; the executor feeds its own last sample).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
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
ALL = -1  # req_id of an error meant for every stream


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
    """API side: `start`, `generate`, `stop`. Everything prefixed `_core` runs on the core thread."""

    def __init__(self, client: ExecutorClient, make_scheduler: Callable[[ExecutorInfo], Scheduler],
                 *, overlap: bool, connect_timeout: float, stream_interval: int = 1):
        self._client = client
        self._make_scheduler = make_scheduler
        self._depth = 2 if overlap else 1
        self._connect_timeout = connect_timeout
        self._stream_interval = max(1, stream_interval)
        self._ids = itertools.count(1)
        self._streams: dict[int, asyncio.Queue] = {}  # API loop only
        self._api_loop: asyncio.AbstractEventLoop | None = None
        self._core_loop: asyncio.AbstractEventLoop | None = None
        self._core_task: asyncio.Task | None = None
        self.stats = StepStats()
        self.info: ExecutorInfo | None = None
        self.scheduler: Scheduler | None = None  # read-only from the API side (load figures)

    # ---- API side ---------------------------------------------------------------------------

    async def start(self) -> ExecutorInfo:
        """Starts the core thread; returns once it has handshaken with the executor."""
        self._api_loop = asyncio.get_running_loop()
        ready = self._api_loop.create_future()
        threading.Thread(target=self._core_thread, args=(ready,), name="engine-core", daemon=True).start()
        return await ready

    def stop(self) -> None:
        if self._core_loop is not None and self._core_task is not None:
            self._core_loop.call_soon_threadsafe(self._core_task.cancel)

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams
                       ) -> AsyncIterator[RequestOutput]:
        """Admits a request and yields its outputs; leaving early (cancellation) aborts it."""
        req_id = next(self._ids)
        queue: asyncio.Queue = asyncio.Queue()
        self._streams[req_id] = queue
        self._core_loop.call_soon_threadsafe(self._core_add, Request(req_id, list(prompt_token_ids), params))
        finished = False
        pending: RequestOutput | None = None  # held until stream_interval tokens are ready
        try:
            while not finished:
                item = _merge_ready(await queue.get(), queue)
                if isinstance(item, EngineError):
                    finished = True
                    raise item
                pending = item if pending is None else _fold(pending, item)
                finished = item.finish_reason is not None
                if finished or len(pending.new_token_ids) >= self._stream_interval:
                    yield pending
                    pending = None
        finally:
            del self._streams[req_id]
            if not finished:
                self._core_loop.call_soon_threadsafe(self._core_abort, req_id)

    def _deliver(self, items: list[tuple[int, RequestOutput | EngineError]]) -> None:
        """One step's outputs, on the API loop: each to its request's queue."""
        for req_id, item in items:
            if req_id == ALL:
                for queue in self._streams.values():
                    queue.put_nowait(item)
                continue
            queue = self._streams.get(req_id)
            if queue is not None:
                queue.put_nowait(item)

    # ---- core thread ------------------------------------------------------------------------

    def _core_thread(self, ready: asyncio.Future) -> None:
        from scheduler_svc.server import run_async

        run_async(self._core_main(ready))

    async def _core_main(self, ready: asyncio.Future) -> None:
        self._core_loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._inflight: deque[SchedulerOutput] = deque()
        try:
            info = await self._core_connect()
        except BaseException as e:  # noqa: BLE001 - handed to the API side
            self._api_loop.call_soon_threadsafe(ready.set_exception, e)
            return
        self._api_loop.call_soon_threadsafe(ready.set_result, info)
        self._core_task = asyncio.current_task()
        try:
            await self._core_run()
        except asyncio.CancelledError:
            await self._client.close()

    async def _core_connect(self) -> ExecutorInfo:
        info = await self._client.connect(self._connect_timeout)
        self.info, self.scheduler = info, self._make_scheduler(info)
        return info

    def _core_add(self, request: Request) -> None:
        try:
            self.scheduler.add_request(request)
        except ValueError as e:  # validation let through a request the core can never run
            self._publish([(request.req_id, EngineError("INVALID_ARGUMENT", str(e)))])
        self._wake.set()

    def _core_abort(self, req_id: int) -> None:
        self.scheduler.abort_request(req_id)
        self._wake.set()

    def _publish(self, items: list) -> None:
        if items:
            self._api_loop.call_soon_threadsafe(self._deliver, items)

    async def _core_run(self) -> None:
        """The step loop; reconnects when the executor goes away."""
        while True:
            try:
                await self._core_step_loop()
            except ExecutorUnavailable as e:
                log.error("executor lost: %s; failing every request and reconnecting", e)
                self._inflight.clear()
                self._publish([(ALL, EngineError("UNAVAILABLE", f"the executor went away: {e}"))])
                await self._core_connect()

    async def _core_step_loop(self) -> None:
        while True:
            if len(self._inflight) < self._depth and self.scheduler.has_work():
                out = self.scheduler.schedule()
                if _has_content(out):
                    await self._client.send(out)
                    self._inflight.append(out)
                    continue
            if self._inflight:
                self._core_apply(await self._client.receive())
                continue
            self._wake.clear()
            if not self.scheduler.has_work():
                await self._wake.wait()
            else:
                # Work exists but nothing could be scheduled: wait for a change, not a spin.
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=0.05)
                except asyncio.TimeoutError:
                    pass

    def _core_apply(self, result: epb.StepResult) -> None:
        out = self._inflight.popleft()
        if result.step_id != out.step_id:
            raise ExecutorUnavailable(f"result for step {result.step_id}, expected {out.step_id}")
        self._record(result)
        if not result.error:
            outputs = self.scheduler.update_from_output(out, sampled_from_pb(result))
            self._publish([(o.req_id, o) for o in outputs])
            return
        log.error("step %d failed on the executor: %s", out.step_id, result.error)
        items = [(o.req_id, o) for o in self.scheduler.update_from_output(out, {})]
        error = EngineError("INTERNAL", f"the executor failed the step: {result.error}")
        for req_id in out.scheduled_req_ids:
            self.scheduler.abort_request(req_id)
            items.append((req_id, error))
        self._publish(items)

    def _record(self, result: epb.StepResult) -> None:
        s = self.stats
        s.num_steps += 1
        s.prepare_us += result.prepare_us
        s.forward_us += result.forward_us
        s.sample_us += result.sample_us
        s.num_graph_steps += result.graph_size > 0


def _has_content(out: SchedulerOutput) -> bool:
    return bool(out.new_requests or out.cached_requests or out.finished_req_ids or out.preempted_req_ids)


def _fold(earlier: RequestOutput, later: RequestOutput) -> RequestOutput:
    """One output carrying both: the later one's state, both ones' tokens and text."""
    later.new_token_ids = earlier.new_token_ids + later.new_token_ids
    later.new_text = earlier.new_text + later.new_text
    return later


def _merge_ready(item, queue: asyncio.Queue):
    """Folds outputs already queued behind `item` into one: when the stream falls behind the
    steps, the client gets fewer, larger messages instead of a growing backlog."""
    while not isinstance(item, EngineError) and item.finish_reason is None and not queue.empty():
        nxt = queue.get_nowait()
        if isinstance(nxt, EngineError):
            return nxt
        item = _fold(item, nxt)
    return item
