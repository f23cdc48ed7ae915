"""The API process's handle on the engine: one output queue per request, fed by the engine core.

The scheduler core and the executor stream run in their own process (engine/core_process.py); this
side admits and aborts requests over a pipe and fans each step's outputs out to the request
streams. A stream that falls behind gets its queued outputs folded into fewer messages.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
from collections.abc import AsyncIterator

from scheduler_svc.config import SchedulerConfig
from scheduler_svc.core.outputs import RequestOutput
from scheduler_svc.core.request import SamplingParams
from scheduler_svc.engine.core_process import core_process_main
from scheduler_svc.messages import (ALL, AbortRequest, AddRequest, CoreStats, Failed, Outputs,
                                    RequestError, decode_output)
from step_protocol.domain import ExecutorInfo

log = logging.getLogger("llmserve.engine")


class EngineClient:
    """Starts the engine core process and streams its outputs to the requests of this process."""

    def __init__(self, config: SchedulerConfig):
        self._config = config
        self._stream_interval = max(1, config.stream_interval)
        self._ids = itertools.count(1)
        self._streams: dict[int, asyncio.Queue] = {}
        self._conn = None
        self._process = None
        self.info: ExecutorInfo | None = None
        self.stats = CoreStats()  # as of the core's last message
        self.core_lost = asyncio.Event()

    async def start(self) -> ExecutorInfo:
        """Starts the core process; returns once it has handshaken with the executor."""
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe(duplex=True)
        self._process = ctx.Process(target=core_process_main, args=(self._config, child),
                                    name="llmserve-engine-core", daemon=True)
        self._process.start()
        child.close()
        loop = asyncio.get_running_loop()
        msg = await loop.run_in_executor(None, self._conn.recv)
        if isinstance(msg, Failed):
            raise RuntimeError(f"the engine core could not start: {msg.message}")
        self.info = msg.info
        loop.add_reader(self._conn.fileno(), self._on_readable)
        return self.info

    def stop(self) -> None:
        """Stops the core process (call from the API loop)."""
        if self._conn is not None and not self.core_lost.is_set():
            asyncio.get_running_loop().remove_reader(self._conn.fileno())
        if self._process is not None and self._process.is_alive():
            self._process.terminate()
            self._process.join(5)

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams
                       ) -> AsyncIterator[RequestOutput]:
        """Admits a request and yields its outputs; leaving early (cancellation) aborts it."""
        if self.core_lost.is_set():
            raise RequestError("UNAVAILABLE", "the engine core process is gone")
        req_id = next(self._ids)
        queue: asyncio.Queue = asyncio.Queue()
        self._streams[req_id] = queue
        self._conn.send(AddRequest(req_id, list(prompt_token_ids), params))
        finished = False
        pending: RequestOutput | None = None  # held until stream_interval tokens are ready
        try:
            while not finished:
                item = _merge_ready(await queue.get(), queue)
                if isinstance(item, RequestError):
                    finished = True
                    raise item
                pending = item if pending is None else _fold(pending, item)
                finished = item.finish_reason is not None
                if finished or len(pending.new_token_ids) >= self._stream_interval:
                    yield pending
                    pending = None
        finally:
            del self._streams[req_id]
            if not finished and not self.core_lost.is_set():
                self._conn.send(AbortRequest(req_id))

    def _on_readable(self) -> None:
        """Messages from the core process: each step's outputs, to their requests' queues."""
        try:
            while self._conn.poll():
                msg: Outputs = self._conn.recv()
                self.stats = CoreStats(*msg.stats)
                self._deliver([(t[0], decode_output(t)) for t in msg.outputs])
                self._deliver(msg.errors)
        except (EOFError, OSError):
            log.error("the engine core process exited; failing %d requests", len(self._streams))
            asyncio.get_running_loop().remove_reader(self._conn.fileno())
            self.core_lost.set()
            self._deliver([(ALL, RequestError("UNAVAILABLE", "the engine core process exited"))])

    def _deliver(self, items: list) -> None:
        for req_id, item in items:
            if req_id == ALL:
                for queue in self._streams.values():
                    queue.put_nowait(item)
                continue
            queue = self._streams.get(req_id)
            if queue is not None:
                queue.put_nowait(item)


def _fold(earlier: RequestOutput, later: RequestOutput) -> RequestOutput:
    """One output carrying both: the later one's state, both ones' tokens and text."""
    later.new_token_ids = earlier.new_token_ids + later.new_token_ids
    later.new_text = earlier.new_text + later.new_text
    return later


def _merge_ready(item, queue: asyncio.Queue):
    """Folds outputs already queued behind `item` into one: when the stream falls behind the
    steps, the client gets fewer, larger messages instead of a growing backlog."""
    while not isinstance(item, RequestError) and item.finish_reason is None and not queue.empty():
        nxt = queue.get_nowait()
        if isinstance(nxt, RequestError):
            return nxt
        item = _fold(item, nxt)
    return item
