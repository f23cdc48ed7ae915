"""grpc.aio servicer of the executor API: thin; the model runs in one worker thread."""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

from executor_svc.model_runner import ModelRunner, StepHandle
from executor_svc.pipeline import StepPipeline
from protos.llmserve.executor.v1 import executor_pb2 as pb
from protos.llmserve.executor.v1 import executor_pb2_grpc as pb_grpc
from step_protocol import codec
from step_protocol.domain import StepResult

log = logging.getLogger(__name__)


class ExecutorServicer(pb_grpc.ExecutorServicer):
    """Handshake / Execute / Reset over a ModelRunner. One worker thread owns the device, so
    steps launch strictly in order and the event loop stays free for I/O; a second thread
    waits for launched steps to complete (see pipeline.py)."""

    def __init__(self, runner: ModelRunner, worker: ThreadPoolExecutor,
                 waiter: ThreadPoolExecutor | None = None):
        self.runner = runner
        self.worker = worker  # single thread: launch, reset
        self.waiter = waiter or ThreadPoolExecutor(max_workers=1, thread_name_prefix="executor-wait")
        self.info = codec.info_to_pb(runner.info())

    async def Handshake(self, request: pb.HandshakeRequest, context) -> pb.ExecutorInfo:
        return self.info

    async def Execute(self, request_iterator, context):
        """One result per plan, in order; step N+1 is launched while step N runs whenever plan
        N+1 has arrived. A plan that fails answers with its error, and the stream goes on."""
        pipeline = StepPipeline(self._launch, self.runner.finish, self.worker, self.waiter)
        async for msg, result in pipeline.run(request_iterator):
            if isinstance(result, BaseException):
                log.error("step %d failed", msg.step_id, exc_info=result)
                error = f"{type(result).__name__}: {result}"
                yield codec.result_to_pb(StepResult(step_id=msg.step_id, error=error))
            else:
                yield codec.result_to_pb(result)

    def _launch(self, msg: pb.StepPlan) -> StepHandle:
        return self.runner.launch(codec.plan_from_pb(msg))

    async def Reset(self, request: pb.ResetRequest, context) -> pb.ResetResponse:
        await asyncio.get_running_loop().run_in_executor(self.worker, self.runner.reset)
        return pb.ResetResponse()
