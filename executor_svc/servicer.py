"""grpc.aio servicer of the executor API: thin; the model runs in one worker thread."""

from __future__ import annotations

import asyncio
import logging
import traceback
from concurrent.futures import ThreadPoolExecutor

from executor_svc import wire
from executor_svc.model_runner import ModelRunner
from protos.llmserve.executor.v1 import executor_pb2 as pb
from protos.llmserve.executor.v1 import executor_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)


class ExecutorServicer(pb_grpc.ExecutorServicer):
    """Handshake / Execute / Reset over a ModelRunner. One worker thread owns the device, so
    steps run strictly in order and the event loop stays free for I/O."""

    def __init__(self, runner: ModelRunner, worker: ThreadPoolExecutor):
        self.runner = runner
        self.worker = worker  # single thread
        self.info = wire.info_to_pb(runner.info())

    async def Handshake(self, request: pb.HandshakeRequest, context) -> pb.ExecutorInfo:
        return self.info

    async def Execute(self, request_iterator, context):
        """One result per plan, in order; a plan that fails answers with its error, and the stream goes on."""
        loop = asyncio.get_running_loop()
        async for msg in request_iterator:
            try:
                plan = wire.plan_from_pb(msg)
                out = await loop.run_in_executor(self.worker, self.runner.execute, plan)
                yield wire.result_to_pb(out)
            except Exception as exc:  # noqa: BLE001 - reported to the scheduler
                log.error("step %d failed: %s", msg.step_id, traceback.format_exc())
                yield wire.error_to_pb(msg.step_id, f"{type(exc).__name__}: {exc}")

    async def Reset(self, request: pb.ResetRequest, context) -> pb.ResetResponse:
        await asyncio.get_running_loop().run_in_executor(self.worker, self.runner.reset)
        return pb.ResetResponse()
