"""The API process's handle on the engine: one output queue per request, fed by the engine core.

The scheduler core and the executor stream run in their own process (engine/core_process.py); this
side admits and aborts requests over a framed channel (scheduler_svc/pipe.py) and fans each
step's outputs out to the request streams. A stream that falls behind gets its queued outputs
folded into fewer messages, and so does every stream while this process falls behind
(api/stream_pacing.py); one whose client stopped reading (its RPC stuck in one write with
more than --max-stream-backlog tokens queued, or for more than --max-stream-stall seconds) has
its request aborted, so that it no longer holds a slot and KV blocks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

from scheduler_svc.api.core_process_handle import CoreProcess, CoreStartError, RestartPolicy  # noqa: F401
from scheduler_svc.api.stream_pacing import Pacer, fold, merge_ready
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.core.outputs import RequestOutput
from scheduler_svc.core.request import SamplingParams
from scheduler_svc.messages import (ALL, AbortRequest, AddRequest, CoreStats, Outputs,
                                    RequestError, decode_output)
from scheduler_svc.pipe import (Channel, ChannelBroken, ChannelClosed, FrameTooLarge,
                                UndeliverableMessage)
from step_protocol.domain import ExecutorInfo

log = logging.getLogger("llmserve.engine")
# A stream over its backlog is a slow consumer only once its RPC has been stuck in one write
# this long: a stream that keeps writing (say, catching up after this process stalled) is not.
STALL_S = 1.0
# No output delivered for this long: this process (or the core) paused, and --max-stream-stall
# counts from the end of the pause (steps slower than this leave only the backlog bound).
PAUSE_S = 2.0


class _Stream:
    """One client request's outputs (of all its samples) not yet taken by its RPC, and how
    many tokens they hold."""

    __slots__ = ("queue", "num_queued_tokens", "aborted", "reading", "last_read", "live", "held", "last_write")

    def __init__(self, req_ids: range):
        self.queue: asyncio.Queue = asyncio.Queue()  # bounded: see _too_slow
        self.live = set(req_ids)  # samples not finished yet
        self.num_queued_tokens = 0
        self.aborted = False  # too far behind: the core was told to abort the request
        # The RPC waits for its next output (it keeps up): never a slow consumer, however many
        # outputs a burst (after a stall of this process) has just queued for it.
        self.reading = False
        self.last_read = time.monotonic()  # when the RPC last took outputs (its last write ended)
        self.held: list[RequestOutput] = []  # paced: outputs not queued yet (api/stream_pacing.py)
        self.last_write = 0.0  # when the RPC last yielded a message


class EngineClient:
    """Starts the engine core process and streams its outputs to the requests of this process."""

    def __init__(self, config: SchedulerConfig, metrics=None):
        self._config = config
        self.metrics = metrics  # api/metrics.Metrics: sees each request's events, or None
        self._stream_interval = max(1, config.stream_interval)
        self._max_backlog = max(1, config.max_stream_backlog)
        self._max_stall = config.max_stream_stall if config.max_stream_stall > 0 else float("inf")
        self._last_delivery = self._resumed_at = 0.0  # (see PAUSE_S)
        self._next_id = 1
        self._streams: dict[int, _Stream] = {}
        self._channel: Channel | None = None
        self._core: CoreProcess | None = None  # the core process now (api/core_process_handle.py)
        self._reader: asyncio.Task | None = None  # reads its outputs; restarts it when it dies
        self.pacer = Pacer(config.stream_pacing_ms / 1e3)
        self._pacing: asyncio.Task | None = None  # the pacer's lag watch (None: --stream-pacing-ms 0)
        self.info: ExecutorInfo | None = None
        self.stats = CoreStats()  # as of the core's last message
        self.restarting = False  # the core died and a new one is starting: requests get UNAVAILABLE
        self.num_restarts = 0  # cores that died (health shows each, however short: api/server.py)
        self.core_lost = asyncio.Event()  # set when the core cannot be restarted: the server exits
        self.restart_policy = RestartPolicy()

    async def start(self) -> ExecutorInfo:
        """Starts the core process; returns once it has handshaken with the executor. A start
        that fails or is cancelled (a signal during start-up) leaves no core process behind."""
        self._core = CoreProcess(self._config)
        self.info = await self._core.start()
        self._channel = self._core.channel
        self._reader = asyncio.create_task(self._read_outputs())
        if self.pacer.max_gap > 0:
            self._pacing = asyncio.create_task(self.pacer.run(lambda: bool(self._streams)))
        return self.info

    async def stop(self, timeout: float = 5.0) -> None:
        """Closes the channel (the core stops on EOF) and waits for the core process to exit;
        kills it after `timeout` seconds. Also ends a restart in progress."""
        for task in (self._reader, self._pacing):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self._core is not None:
            await self._core.stop(timeout)

    async def _restart(self, cause: Exception) -> None:
        """The core died: fails every request UNAVAILABLE, logs how it ended in one line, starts
        a new one within core_process_handle's RestartPolicy; gives up (core_lost) past it.
        Meanwhile health says NOT_SERVING (stats: no executor) and new requests UNAVAILABLE."""
        self.restarting, self.stats = True, CoreStats()
        self.num_restarts += 1
        num_failed = len(set(self._streams.values()))
        self._deliver(ALL, RequestError("UNAVAILABLE", "the engine core process died; it is "
                                        "restarting, retry later"))
        self.restart_policy.core_died(time.monotonic() - self._core.started_at)
        detail = "" if isinstance(cause, ChannelClosed) else f" ({type(cause).__name__}: {cause})"
        log.error("the engine core process %s%s; restarting it; failing %d requests",
                  await self._core.ended(), detail, num_failed)
        while (delay := self.restart_policy.next_delay()) is not None:
            await asyncio.sleep(delay)
            self._core = core = CoreProcess(self._config)  # (here before its start: stop() reaches it)
            try:
                self.info = await core.start()
            except CoreStartError as e:
                log.error("%s; %d restarts failed in a row", e, self.restart_policy.failures)
                continue
            self._channel, self.restarting = core.channel, False
            log.info("the engine core restarted (pid %d); serving again", core.process.pid)
            return
        log.error("the engine core could not be restarted (%d attempts in a row failed); giving up",
                  self.restart_policy.max_failures)
        self.core_lost.set()

    @property
    def num_requests(self) -> int:
        """Requests (samples) admitted by this process and not yet finished (running or
        waiting)."""
        return len(self._streams)

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams
                       ) -> AsyncIterator[RequestOutput]:
        """Admits a request and yields the outputs of its params.n samples, each with its
        index, as they come; leaving early (cancellation) aborts every sample still running.
        An error of any sample ends them all."""
        if self.core_lost.is_set() or self.restarting:
            raise RequestError("UNAVAILABLE", "the engine core process is gone" if self.core_lost.is_set()
                               else "the engine core process is restarting; retry later")
        req_id, n = self._next_id, params.n
        self._next_id += n  # the samples' ids: req_id .. req_id + n - 1
        try:
            self._channel.send_nowait(AddRequest(req_id, list(prompt_token_ids), params))
        except FrameTooLarge as e:
            raise RequestError("RESOURCE_EXHAUSTED", f"the request is too large: {e}") from e
        except UndeliverableMessage as e:
            raise RequestError("INTERNAL", f"the request could not be sent to the engine: {e}") from e
        except ChannelClosed as e:
            raise RequestError("UNAVAILABLE", "the engine core process is gone") from e
        ids = range(req_id, req_id + n)
        if self.metrics is not None:
            self.metrics.arrived(ids, len(prompt_token_ids), time.monotonic())
        stream = _Stream(ids)
        for i in ids:  # before any await: no output can be missed
            self._streams[i] = stream
        self.pacer.streams_started()
        pending: dict[int, RequestOutput] = {}  # per sample, until stream_interval tokens are ready
        failed = False  # ended by an error of the server (not the client leaving)
        try:
            try:
                await self._channel.drain()  # admission waits while the core is far behind
            except ChannelClosed:
                pass  # the reader fails every stream, this one too
            while stream.live:
                stream.reading = True
                try:
                    item = await stream.queue.get()
                finally:
                    stream.reading = False
                    stream.last_read = time.monotonic()
                items = merge_ready(item, stream.queue)
                if isinstance(items, RequestError):
                    failed = not stream.aborted
                    raise items
                for out in items:
                    stream.num_queued_tokens -= len(out.new_token_ids)
                    out.index = out.req_id - req_id
                    earlier = pending.pop(out.req_id, None)
                    out = out if earlier is None else fold(earlier, out)
                    if out.finish_reason is not None:
                        stream.live.discard(out.req_id)
                    elif len(out.new_token_ids) < self._stream_interval:
                        pending[out.req_id] = out
                        continue
                    stream.last_write = stream.last_read
                    yield out
        finally:
            for i in ids:
                del self._streams[i]
            if self.metrics is not None:
                now = time.monotonic()
                for i in sorted(stream.live):
                    self.metrics.ended(i, failed, now)
            if not stream.aborted and not self.core_lost.is_set():
                for i in sorted(stream.live):  # (one that failed is gone: the abort is ignored)
                    self._send_abort(i)

    def _send_abort(self, req_id: int) -> None:
        try:
            self._channel.send_nowait(AbortRequest(req_id))  # never waits: see pipe.py
        except ChannelClosed:
            pass  # the core is gone; the reader fails every stream

    async def _read_outputs(self) -> None:
        """Messages from the core process: each step's outputs, to their requests' queues;
        when the core dies, restarts it (_restart) and reads the new one's."""
        while not self.core_lost.is_set():
            try:
                await self._read_until_lost()
            except (ChannelClosed, ChannelBroken, OSError) as e:
                await self._restart(e)

    async def _read_until_lost(self) -> None:
        """Delivers the current core's messages until its channel ends (raises)."""
        while True:
            msg: Outputs = await self._channel.recv()
            self.stats = CoreStats(*msg.stats)
            metrics = self.metrics
            if metrics is None:
                for t in msg.outputs:
                    self._deliver(t[0], decode_output(t))
            else:
                now = time.monotonic()
                for req_id, when in msg.scheduled:
                    metrics.scheduled(req_id, when)
                outs = [decode_output(t) for t in msg.outputs]
                metrics.outputs(outs, now)  # (per message: one counter addition)
                for out in outs:
                    self._deliver(out.req_id, out)
            for req_id, error in msg.errors:
                self._deliver(req_id, error)
            # Let the streams take their outputs between frames: after a stall of this
            # process, a burst of queued frames would otherwise pile up in every queue at
            # once and look like clients that stopped reading.
            await asyncio.sleep(0)

    def _deliver(self, req_id: int, item: RequestOutput | RequestError) -> None:
        if req_id == ALL:
            for stream in set(self._streams.values()):  # (a stream per request, not per sample)
                stream.queue.put_nowait(item)
            return
        stream = self._streams.get(req_id)
        if stream is None or stream.aborted:
            return
        if isinstance(item, RequestOutput):
            now = time.monotonic()
            if now - self._last_delivery > PAUSE_S:
                self._resumed_at = now
            self._last_delivery = now
            stream.num_queued_tokens += len(item.new_token_ids)
            if item.finish_reason is None:
                if not stream.reading and self._too_slow(stream, now):
                    self._abort_slow_stream(req_id, stream)
                    return
                if now - stream.last_write < self.pacer.gap:  # paced: held, its RPC not woken
                    stream.held.append(item)
                    return
            if stream.held:  # (they fold into this one message: merge_ready)
                for held in stream.held:
                    stream.queue.put_nowait(held)
                stream.held.clear()
        stream.queue.put_nowait(item)

    def _too_slow(self, stream: _Stream, now: float) -> bool:
        """Its RPC is stuck in one write (the client's transport takes nothing more) past
        STALL_S with more than the backlog queued, or past --max-stream-stall, not counting a
        pause of this process or of the core (streams catching up after it are not slow)."""
        if now - stream.last_read <= STALL_S:
            return False
        return (stream.num_queued_tokens > self._max_backlog * len(stream.live)  # a sample running
                or now - max(stream.last_read, self._resumed_at) > self._max_stall)

    def _abort_slow_stream(self, req_id: int, stream: _Stream) -> None:
        """Decided here, not in the RPC: its generator is stuck in a write to a client that
        does not read (HTTP/2 or TCP flow control). Frees the request's slots and blocks now
        (all its samples); the RPC ends RESOURCE_EXHAUSTED when the client reads again or gives up."""
        why = (f"{stream.num_queued_tokens} tokens were waiting unread and none had been read for "
               f"{time.monotonic() - stream.last_read:.1f} s (--max-stream-backlog {self._max_backlog}, "
               f"--max-stream-stall {self._config.max_stream_stall:g})")
        log.warning("request %d: the client read too slowly: %s; aborting it", req_id, why)
        message = f"the client read too slowly: {why}, so the request was aborted"
        while not stream.queue.empty():
            stream.queue.get_nowait()
        stream.held.clear()
        stream.aborted = True
        stream.num_queued_tokens = 0
        stream.queue.put_nowait(RequestError("RESOURCE_EXHAUSTED", message))
        for i in sorted(stream.live):
            self._send_abort(i)

