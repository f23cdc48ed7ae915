"""grpc.aio servicer of the executor API: thin; the model runs in one worker thread."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterable, AsyncIterator
from concurrent.futures import ThreadPoolExecutor

import grpc

from executor_svc.service.pipeline import StepPipeline
from executor_svc.service.stream_slot import StreamSlot
from executor_svc.worker.model_runner import ModelRunner
from executor_svc.worker.plan_checks import PlanError
from executor_svc.worker.step_handle import StepHandle
from protos.llmserve.executor.v1 import executor_pb2 as pb
from protos.llmserve.executor.v1 import executor_pb2_grpc as pb_grpc
from step_protocol import codec
from step_protocol.domain import StepResult

log = logging.getLogger(__name__)
SECOND_STREAM = ("another Execute stream is open: the executor serves one plan stream at a time "
                 "(a scheduler that reconnects calls Reset first, which ends the old stream)")
TAKEN_OVER = "a Reset took over the executor: this plan stream is ended and its requests forgotten"


class ExecutorServicer(pb_grpc.ExecutorServicer):
    """Handshake / Execute / Reset over a ModelRunner. One worker thread owns the device, so
    steps launch strictly in order and the event loop stays free for I/O; a second thread
    waits for launched steps to complete (see pipeline.py). One Execute stream at a time;
    Reset ends it first (stream_slot.py)."""

    def __init__(self, runner: ModelRunner, worker: ThreadPoolExecutor,
                 waiter: ThreadPoolExecutor | None = None):
        self.runner = runner
        self.worker = worker  # single thread: launch, reset
        self.waiter = waiter or ThreadPoolExecutor(max_workers=1, thread_name_prefix="executor-wait")
        self.info = codec.info_to_pb(runner.info())
        self.slot = StreamSlot()

    async def Handshake(self, request: pb.HandshakeRequest, context) -> pb.ExecutorInfo:
        return self.info

    async def Execute(self, request_iterator, context) -> None:
        """One result per plan, in order; step N+1 is launched while step N runs whenever plan
        N+1 has arrived. A plan that fails answers with its error, and the stream goes on.
        Results are written (not yielded) so that a cancelled stream runs its `finally` at
        once and frees the slot for the next one."""
        lease = self.slot.try_acquire()
        if lease is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, SECOND_STREAM)
        pipeline = StepPipeline(self._launch, self.runner.finish, self.worker, self.waiter)
        try:
            async with contextlib.aclosing(pipeline.run(_arrivals(request_iterator))) as results:
                async for (msg, _), result in results:
                    await context.write(_result_pb(msg, result))
        except asyncio.CancelledError:
            if not lease.taken_over:
                raise  # the client went away
            log.warning("Reset took over from the open plan stream")
            await context.abort(grpc.StatusCode.ABORTED, TAKEN_OVER)
        finally:
            self.slot.release(lease)

    def _launch(self, item: tuple[pb.StepPlan, float]) -> StepHandle:
        msg, arrived = item
        return self.runner.launch(codec.plan_from_pb(msg), arrived)

    async def Reset(self, request: pb.ResetRequest, context) -> pb.ResetResponse:
        """Ends the open plan stream (if any), waits for its launched steps, then forgets every
        request: a reconnecting scheduler starts from a clean executor."""
        try:
            async with self.slot.taken_over():
                await asyncio.get_running_loop().run_in_executor(self.worker, self.runner.reset)
        except TimeoutError:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the open plan stream did not end; retry")
        return pb.ResetResponse()


async def _arrivals(plans: AsyncIterable[pb.StepPlan]) -> AsyncIterator[tuple[pb.StepPlan, float]]:
    """Each plan with the time it arrived (the step's queued_us counts from there)."""
    async for msg in plans:
        yield msg, time.perf_counter()


def _result_pb(msg: pb.StepPlan, result) -> pb.StepResult:
    """The wire result of a step, or of the exception its launch raised."""
    if not isinstance(result, BaseException):
        return codec.result_to_pb(result)
    if isinstance(result, PlanError):  # refused before anything changed: no traceback needed
        log.warning("step %d refused: %s", msg.step_id, result)
    else:
        log.error("step %d failed", msg.step_id, exc_info=result)
    return codec.result_to_pb(StepResult(step_id=msg.step_id, error=f"{type(result).__name__}: {result}"))
