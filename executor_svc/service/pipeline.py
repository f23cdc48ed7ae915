"""Pipelined step execution: step N+1 is launched while step N still runs on the device.

Plans are read into a queue by their own task. The loop launches each plan on the single
device thread as soon as it has arrived and fewer than `depth` steps are unanswered (launch
order = plan order), and finishes launched steps on a second thread (waiting on a CUDA event
releases the GIL), so waiting for the oldest step and waiting for the next plan happen at
once. Results come out strictly in plan order. When no next plan comes (a scheduler without
overlap waits for result N before it sends N+1; the last step) the oldest step is simply
finished and answered: nothing waits for a plan that may never come.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Callable
from concurrent.futures import Executor
from typing import Any

log = logging.getLogger(__name__)
_END = object()
MAX_READ_AHEAD = 8  # plans read and queued beyond the `depth` launched (the scheduler keeps <= 8 in flight)


class StepPipeline:
    """launch(item) -> handle runs on `worker` (one thread: the device); finish(handle) -> result
    on `waiter`. run() yields (item, result or the exception it raised), in item order."""

    def __init__(self, launch: Callable[[Any], Any], finish: Callable[[Any], Any],
                 worker: Executor, waiter: Executor, depth: int = 2):
        self.launch, self.finish = launch, finish
        self.worker, self.waiter, self.depth = worker, waiter, depth

    async def run(self, items: AsyncIterable) -> AsyncIterator[tuple[Any, Any]]:
        # bounded: a peer that sends plans faster than they run is slowed by gRPC flow control
        queue: asyncio.Queue = asyncio.Queue(maxsize=MAX_READ_AHEAD)
        reader = asyncio.ensure_future(_read(items, queue))
        steps: deque[tuple[Any, asyncio.Future]] = deque()  # launched, not yet answered
        getter: asyncio.Future | None = None
        ended = False
        try:
            while steps or not ended:
                waits = [steps[0][1]] if steps else []
                if not ended and len(steps) < self.depth:
                    getter = getter or asyncio.ensure_future(queue.get())
                    waits.append(getter)
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                if getter is not None and getter.done():
                    item, getter = getter.result(), None
                    if item is _END:
                        ended = True
                    else:
                        steps.append((item, self._start(item)))
                while steps and steps[0][1].done():
                    item, fut = steps.popleft()
                    yield item, fut.exception() or fut.result()
        finally:
            reader.cancel()
            for fut in [getter] + [f for _, f in steps]:
                if fut is not None:
                    fut.cancel()

    def _start(self, item) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        launched = loop.run_in_executor(self.worker, self.launch, item)  # submitted now: plan order
        return asyncio.ensure_future(self._finish(loop, launched))

    async def _finish(self, loop: asyncio.AbstractEventLoop, launched: asyncio.Future):
        return await loop.run_in_executor(self.waiter, self.finish, await launched)


async def _read(items: AsyncIterable, queue: asyncio.Queue) -> None:
    try:
        async for item in items:
            await queue.put(item)
    except Exception as exc:  # noqa: BLE001 - the stream broke: answer what was launched, then end
        log.warning("plan stream ended: %s", exc)
    await queue.put(_END)  # not reached when cancelled: run() has stopped reading then
