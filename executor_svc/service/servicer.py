"""The executor API as the endpoint process serves it (service/endpoint.py): bytes in, bytes out.

Handshake answers the ExecutorInfo bytes the device process sent at start. Execute forwards each
plan's bytes over the link (service/link.py) under its stream's epoch, and writes back the result
bytes of that epoch as they come, in order; it never parses a plan nor builds a result. Reset takes
the stream slot over (stream_slot.py), then asks the device process to reset once every step
launched before is answered. Nothing here blocks the event loop, and every queue is bounded: at
most MAX_UNANSWERED plans are on their way to the device or being run, over every stream.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator

import grpc

from executor_svc.service import link
from executor_svc.service.stream_slot import StreamSlot
from protos.llmserve.executor.v1 import executor_pb2

log = logging.getLogger(__name__)
SERVICE = executor_pb2.DESCRIPTOR.services_by_name["Executor"].full_name
MAX_UNANSWERED = 8  # plans sent to the device and not yet answered (the scheduler keeps <= 8 in flight)
SECOND_STREAM = ("another Execute stream is open: the executor serves one plan stream at a time "
                 "(a scheduler that reconnects calls Reset first, which ends the old stream)")
TAKEN_OVER = "a Reset took over the executor: this plan stream is ended and its requests forgotten"


class ExecutorEndpoint:
    """Handshake / Execute / Reset over the link to the device process; lives on the endpoint's
    event loop. on_frame() takes the device's result and reset-done frames."""

    def __init__(self, info: bytes, writer: asyncio.StreamWriter, max_unanswered: int = MAX_UNANSWERED):
        self.info, self._writer = info, writer
        self.slot = StreamSlot()
        self._window = asyncio.Semaphore(max_unanswered)  # one permit per plan until its result
        self._streams: dict[int, asyncio.Queue] = {}  # open streams' epochs -> their results
        self._resets: dict[int, asyncio.Future] = {}  # reset id -> its error text ("" = done)
        self._ids = itertools.count(1)  # epochs and reset ids
        self._alive_at = 0.0  # the loop's time of the device's last alive frame
        self._next_alive: asyncio.Future | None = None  # what a Handshake waits for when that is stale

    def handler(self) -> grpc.GenericRpcHandler:
        """The Executor service with raw bytes for requests and responses."""
        return grpc.method_handlers_generic_handler(SERVICE, {
            "Handshake": grpc.unary_unary_rpc_method_handler(self.handshake),
            "Execute": grpc.stream_stream_rpc_method_handler(self.execute),
            "Reset": grpc.unary_unary_rpc_method_handler(self.reset)})

    def on_frame(self, frame: link.Frame) -> None:
        if frame.kind == link.RESULT:
            self._window.release()
            results = self._streams.get(frame.tag)
            if results is not None:  # else its stream has ended: dropped
                results.put_nowait(frame.body)
        elif frame.kind == link.ALIVE:
            self._alive_at = asyncio.get_running_loop().time()
            if self._next_alive is not None and not self._next_alive.done():
                self._next_alive.set_result(None)
        elif frame.kind == link.RESET_DONE:
            done = self._resets.pop(frame.tag, None)
            if done is not None and not done.done():
                done.set_result(frame.body.decode("utf-8", "replace"))
        else:
            raise link.LinkBroken(f"unexpected frame kind {frame.kind!r} from the device process")

    async def handshake(self, request: bytes, context) -> bytes:
        """The ExecutorInfo bytes, once the device process is known to be alive (link.py)."""
        loop = asyncio.get_running_loop()
        while loop.time() - self._alive_at > link.STALE_S:
            if self._next_alive is None or self._next_alive.done():
                self._next_alive = loop.create_future()
            await asyncio.shield(self._next_alive)
        return self.info

    async def execute(self, plans: AsyncIterator[bytes], context) -> None:
        """One result per plan, in order; a plan that fails answers with its error, and the stream
        goes on. Results are written (not yielded) so that a cancelled stream runs its `finally`
        at once and frees the slot for the next one."""
        lease = self.slot.try_acquire()
        if lease is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, SECOND_STREAM)
        epoch = next(self._ids)
        results = self._streams[epoch] = asyncio.Queue()  # bounded by the window
        sender = asyncio.ensure_future(self._send_plans(plans, epoch, results))
        try:
            sent, answered = None, 0
            while sent is None or answered < sent:
                item = await results.get()
                if isinstance(item, int):  # the plans ended: this many were sent
                    sent = item
                else:
                    await context.write(item)
                    answered += 1
        except asyncio.CancelledError:
            if not lease.taken_over:
                raise  # the client went away
            sender.cancel()  # before the abort ends its plans
            log.warning("Reset took over from the open plan stream")
            await context.abort(grpc.StatusCode.ABORTED, TAKEN_OVER)
        finally:
            sender.cancel()
            del self._streams[epoch]
            self.slot.release(lease)

    async def _send_plans(self, plans: AsyncIterator[bytes], epoch: int, results: asyncio.Queue) -> None:
        sent = 0
        try:
            async for plan in plans:
                arrived = time.monotonic_ns()  # the step's queued_us counts from here
                await self._window.acquire()
                self._writer.write(link.encode(link.PLAN, epoch, plan, arrived))
                sent += 1
                await self._writer.drain()
        except Exception as exc:  # noqa: BLE001 - the stream broke: answer what was sent, then end
            log.warning("plan stream ended: %s", exc)
        results.put_nowait(sent)

    async def reset(self, request: bytes, context) -> bytes:
        """Ends the open plan stream (if any); the device answers its launched steps, then
        forgets every request: a reconnecting scheduler starts from a clean executor."""
        try:
            async with self.slot.taken_over():
                reset_id = next(self._ids)
                done = self._resets[reset_id] = asyncio.get_running_loop().create_future()
                self._writer.write(link.encode(link.RESET, reset_id))
                error = await done
        except TimeoutError:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the open plan stream did not end; retry")
        if error:
            await context.abort(grpc.StatusCode.INTERNAL, f"reset failed: {error}")
        return b""
